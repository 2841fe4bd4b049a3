// The draft's frozen embedding and lm_head are the online target's tensors, not copies, when the
// training device and dtype are the target's (fp32 on the CPU here).
#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "common/dspine_tiny.h"
#include "data/target_source.h"
#include "objectives/dspine_objective.h"
#include "objectives/dspine_settings.h"

namespace dspine::objectives {
namespace {

namespace fs = std::filesystem;

TEST(TargetSharing, DraftFreezesTheTargetsOwnTables) {
  const fs::path model = fs::path(DSPINE_TINY_QWEN3_DIR) / "untied-single";
  if (!fs::exists(model / "config.json")) GTEST_SKIP() << "no tiny model in " << model;
  core::Config c;
  c.model.hidden_size = 32;
  c.model.vocab_size = 96;
  c.model.target_layer_ids = {0, 2, 3};
  c.model.fused_kernels = dspine::core::FusedKernels::kOff;
  c.set_section("model.dspine", dspine::model::DSpineConfig{8, 4, 3});
  c.data.source = dspine::core::DataSource::kTarget;
  c.data.seq_len = 8;
  c.data.target.path = model.string();
  c.data.target.random = true;  // random token ids: no samples file needed
  data::TargetSource source(c.data, c.model, at::kFloat, torch::kCPU);
  auto objective = make_dspine_objective(testing::draft_config(c),
                                         c.section<objectives::DSpineSettings>("objective.dspine"),
                                         c.training.accumulation_steps, source.embed_tokens(),
                                         source.lm_head(), torch::kCPU, torch::kFloat);
  EXPECT_EQ(objective->training_model().embed_tokens().data_ptr(),
            source.model().embed_tokens().data_ptr());
  EXPECT_EQ(objective->training_model().lm_head().data_ptr(), source.model().lm_head().data_ptr());
}

}  // namespace
}  // namespace dspine::objectives
