// Default (unscaled) rotary position embedding (docs/model.md, "Backbone layers").
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dspine::model {

// inv_freq_i = theta^(-2i/d), i < d/2, fp32 (the non-persistent `rotary_emb.inv_freq`).
at::Tensor rope_inv_freq(int64_t head_dim, double theta);

struct RopeTables {
  at::Tensor cos;  // [B, P, d] in the hidden dtype
  at::Tensor sin;
};

// angles = p * inv_freq in fp32, emb = [angles | angles], cast to `dtype`.
RopeTables rope_tables(const at::Tensor& position_ids, const at::Tensor& inv_freq,
                       at::ScalarType dtype);

// x [B, P, heads, d] rotated by cos/sin [B, P', d] using the LAST P rows of the tables (queries
// cover only the block tokens at the end of the key sequence, docs/model.md "Backbone layers").
at::Tensor apply_rope(const at::Tensor& x, const RopeTables& tables);

}  // namespace dspine::model
