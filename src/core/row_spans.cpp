#include "core/row_spans.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace dspine::core {

RowSpans row_spans(const std::vector<int64_t>& starts, int64_t count, const c10::Device& device,
                   at::ScalarType dtype) {
  if (starts.empty() || count < 1) fail("row spans: {} rows of {} positions", starts.size(), count);
  if (*std::min_element(starts.begin(), starts.end()) < 0) fail("row spans: a negative start");
  return row_spans(at::tensor(starts, at::kLong).to(device), count,
                   *std::max_element(starts.begin(), starts.end()) + count, dtype);
}

RowSpans row_spans(const at::Tensor& starts, int64_t count, int64_t keys, at::ScalarType dtype) {
  const int64_t batch = starts.size(0);
  const auto longs = starts.options().dtype(at::kLong);
  RowSpans spans;
  spans.positions = starts.to(at::kLong).unsqueeze(1) + at::arange(count, longs);
  // Contiguous: index_put_ would otherwise copy an expanded index at every write.
  spans.rows = at::arange(batch, longs).unsqueeze(1).expand({batch, count}).contiguous();
  spans.keys = keys;
  const auto visible =
      at::arange(keys, longs).view({1, 1, 1, keys}).le(spans.positions.view({batch, 1, count, 1}));
  spans.bias = at::full(visible.sizes(), -std::numeric_limits<double>::infinity(),
                        starts.options().dtype(dtype))
                   .masked_fill_(visible, 0.0);
  return spans;
}

void write_spans(const at::Tensor& cache, const at::Tensor& values, const RowSpans& spans) {
  cache.index_put_({spans.rows, spans.positions}, values.to(cache.scalar_type()));
}

at::Tensor rows_at(const at::Tensor& table, const at::Tensor& positions) {
  return table.index_select(0, positions.reshape(-1))
      .view({positions.size(0), positions.size(1), table.size(1)});
}

}  // namespace dspine::core
