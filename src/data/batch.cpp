#include "data/batch.h"

#include <torch/torch.h>

#include "core/error.h"

namespace dspine::data {
namespace {

// Applies `fn` to every field (fields a producer left undefined stay undefined).
template <typename Fn>
DraftBatch map_fields(const DraftBatch& batch, Fn fn) {
  const auto apply = [&](const at::Tensor& t) { return t.defined() ? fn(t) : t; };
  return DraftBatch{apply(batch.input_ids), apply(batch.loss_mask), apply(batch.hidden_states),
                    apply(batch.target_last_hidden_states)};
}

}  // namespace

DraftBatch DraftBatch::to(const at::Device& device) const {
  return map_fields(*this, [&](const at::Tensor& t) { return t.to(device); });
}

DraftBatch DraftBatch::slice_rows(int64_t begin, int64_t end) const {
  if (begin < 0 || begin > end || end > rows()) {
    fail("DraftBatch::slice_rows: rows [{}, {}) are outside a batch of {} rows", begin, end, rows());
  }
  return map_fields(*this, [&](const at::Tensor& t) { return t.narrow(0, begin, end - begin); });
}

DraftBatch concat_rows(const std::vector<DraftBatch>& batches) {
  if (batches.empty()) fail("concat_rows: no batches to concatenate");
  const auto cat_field = [&](at::Tensor DraftBatch::*field, const char* name) {
    std::vector<at::Tensor> parts;
    for (const DraftBatch& b : batches) {
      if ((b.*field).defined()) parts.push_back(b.*field);
    }
    if (parts.empty()) return at::Tensor();
    if (parts.size() != batches.size()) fail("concat_rows: field {} is missing in some batches only", name);
    return at::cat(parts, 0);
  };
  return DraftBatch{cat_field(&DraftBatch::input_ids, "input_ids"),
                    cat_field(&DraftBatch::loss_mask, "loss_mask"),
                    cat_field(&DraftBatch::hidden_states, "hidden_states"),
                    cat_field(&DraftBatch::target_last_hidden_states, "target_last_hidden_states")};
}

}  // namespace dspine::data
