// The fixed DSpine transfer space (docs/model.md, "Adjacent injection and the transfer space"): PCA
// of the row-normalized target lm_head, whitened per component and unit-normalized into one code
// per vocabulary token.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dspine::model {

struct TransferSpace {
  at::Tensor codes;        // [V, r] fp32, unit rows
  at::Tensor basis;        // [H, r] fp32, top-r eigenvectors (ascending eigenvalue order)
  at::Tensor eigenvalues;  // [r] fp32, ascending
};

// No autograd; rows are processed `chunk_size` at a time (fp32 accumulation on head's device).
// Throws when fewer than `rank` positive principal directions exist.
TransferSpace compute_transfer_space(const at::Tensor& head, int64_t rank,
                                     int64_t chunk_size = 4096);

}  // namespace dspine::model
