#include "data/batch.h"

#include <torch/torch.h>

#include <algorithm>

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

at::Tensor DraftBatch::loss_mask_on_host() const {
  if (host_loss_mask.defined()) return host_loss_mask;
  return loss_mask.cpu();
}

DraftBatch DraftBatch::to(const at::Device& device) const {
  DraftBatch moved = map_fields(*this, [&](const at::Tensor& t) { return t.to(device); });
  moved.host_loss_mask = host_loss_mask;
  if (!moved.host_loss_mask.defined() && loss_mask.defined() && loss_mask.is_cpu() &&
      !device.is_cpu()) {
    moved.host_loss_mask = loss_mask;
  }
  return moved;
}

DraftBatch DraftBatch::slice_rows(int64_t begin, int64_t end) const {
  if (begin < 0 || begin > end || end > rows()) {
    fail("DraftBatch::slice_rows: rows [{}, {}) are outside a batch of {} rows", begin, end, rows());
  }
  const auto rows_of = [&](const at::Tensor& t) { return t.narrow(0, begin, end - begin); };
  DraftBatch slice = map_fields(*this, rows_of);
  if (host_loss_mask.defined()) slice.host_loss_mask = rows_of(host_loss_mask);
  return slice;
}

at::Tensor queue_copy_to(const at::Tensor& host, const at::Device& device) {
  if (device.is_cpu()) return host;
  return host.pin_memory().to(device, /*non_blocking=*/true);
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
  DraftBatch joined{cat_field(&DraftBatch::input_ids, "input_ids"),
                    cat_field(&DraftBatch::loss_mask, "loss_mask"),
                    cat_field(&DraftBatch::hidden_states, "hidden_states"),
                    cat_field(&DraftBatch::target_last_hidden_states, "target_last_hidden_states")};
  const bool hosts_kept = std::all_of(batches.begin(), batches.end(), [](const DraftBatch& b) {
    return b.host_loss_mask.defined();
  });
  if (hosts_kept) joined.host_loss_mask = cat_field(&DraftBatch::host_loss_mask, "host_loss_mask");
  return joined;
}

}  // namespace dspine::data
