// Batched decoding keeps one cache per model with every row at its own length (docs/decoding.md,
// "Rows of different lengths"). A step appends `count` positions to each row b, at
// starts[b] .. starts[b] + count - 1; these spans say where they go and what each may see. A
// decoding round builds them once and hands them to the draft and the target alike.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

namespace dspine::core {

struct RowSpans {
  at::Tensor rows;       // [B, count] int64, contiguous: b, the row each new position belongs to
  at::Tensor positions;  // [B, count] int64: starts[b] + i
  int64_t keys = 0;      // cached positions attention reads (at least max(starts) + count)
  // [B, 1, count, keys], attention's additive mask in the models' dtype: new position i of row b
  // sees key p (0) iff p <= starts[b] + i, its row's cache before it and itself (−inf elsewhere;
  // the rest of a shorter row is never read). Scaled dot-product attention would turn a bool mask
  // into this at each of its calls; it is made once for every layer of both models.
  at::Tensor bias;
};

// Throws dspine::Error when a start is negative or count < 1. Attention reads max(starts) + count
// keys; `dtype` is the bias's.
RowSpans row_spans(const std::vector<int64_t>& starts, int64_t count, const c10::Device& device,
                   at::ScalarType dtype);

// The same from starts [B] int64 already on the device, attention reading the first `keys` cached
// positions (at least every start + count: the caller's promise, not checked). It reads nothing
// back from the device, so a CUDA graph can capture it, and a fixed `keys` gives fixed shapes.
RowSpans row_spans(const at::Tensor& starts, int64_t count, int64_t keys, at::ScalarType dtype);

// Writes `values` [B, count, ...] into `cache` [B, C, ...] (a view is enough) at the spans.
void write_spans(const at::Tensor& cache, const at::Tensor& values, const RowSpans& spans);

// Rows `positions` [B, count] of a per-position table [C, d]: [B, count, d], contiguous.
at::Tensor rows_at(const at::Tensor& table, const at::Tensor& positions);

}  // namespace dspine::core
