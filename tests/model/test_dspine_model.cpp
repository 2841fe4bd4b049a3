// DSpine draft model: state-dict layout, identity at init, block mask, causality, injection with
// replacement, transfer space (docs/model.md; the reference's tests T1–T3, T6, T7, T10).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/block_mask.h"
#include "model/dspine_config.h"
#include "model/adjacent_injection.h"
#include "model/dspine_draft.h"
#include "model/rope.h"
#include "model/transfer_space.h"

#include "common/dspine_tiny.h"

namespace dspine::model {
namespace {

DSpineModelConfig tiny_config() { return testing::tiny_model_config(); }

DSpineDraft initialized_draft(const DSpineModelConfig& config = tiny_config()) {
  torch::manual_seed(17);
  DSpineDraft draft(config, false);
  auto head = torch::randn({config.vocab_size, config.hidden_size});
  draft->initialize_transfer_space(head, 7);
  return draft;
}

void randomize_writes(DSpineDraftImpl& draft, double std) {
  torch::NoGradGuard no_grad;
  for (auto& w : draft.injection->write_layers) w->weight.normal_(0.0, std);
}

// Blocks of test T6: anchors [[2,5],[1,4]], keep [[T,T],[T,F]], S = 7, bs = 4.
struct BlockInputs {
  torch::Tensor anchors = torch::tensor({{2, 5}, {1, 4}}, torch::kInt64);
  torch::Tensor keep = torch::tensor({{true, true}, {true, false}});
  int64_t seq_len = 7;
  torch::Tensor position_ids, mask, noise, target_hidden, tokens;
};

BlockInputs block_inputs(const core::ModelConfig& c) {
  BlockInputs in;
  const int64_t bs = c.block_size;
  auto context = torch::arange(in.seq_len).unsqueeze(0).expand({2, in.seq_len});
  auto blocks = (in.anchors.unsqueeze(-1) + torch::arange(bs)).view({2, -1});
  in.position_ids = torch::cat({context, blocks}, 1);
  in.mask = block_attention_mask(in.anchors, in.keep, in.seq_len, bs);
  torch::manual_seed(5);
  in.noise = torch::randn({2, 2 * bs, c.hidden_size});
  in.target_hidden = torch::randn({2, in.seq_len, 3 * c.hidden_size});
  in.tokens = torch::randint(0, 30, {2, 2, bs}, torch::kInt64);
  return in;
}

DraftOutput run(DSpineDraftImpl& draft, const BlockInputs& in, const torch::Tensor& replace = {}) {
  return draft.forward(in.position_ids, in.anchors, in.keep, in.noise, in.target_hidden, in.tokens,
                       replace);
}

TEST(DSpineDraft, StateDictKeysShapesAndOrderMatchTheReference) {
  const auto c = tiny_config();
  auto draft = initialized_draft(c);
  std::vector<std::string> names;
  int64_t backbone = 0, injection = 0;
  for (const auto& item : draft->named_parameters()) {
    names.push_back(item.key());
    (item.key().rfind("injection.", 0) == 0 ? injection : backbone) += item.value().numel();
  }
  EXPECT_EQ(backbone, 7832);
  EXPECT_EQ(injection, 676);
  const std::vector<std::string> first_layer = {
      "layers.0.self_attn.q_proj.weight",        "layers.0.self_attn.k_proj.weight",
      "layers.0.self_attn.v_proj.weight",        "layers.0.self_attn.o_proj.weight",
      "layers.0.self_attn.q_norm.weight",        "layers.0.self_attn.k_norm.weight",
      "layers.0.mlp.gate_proj.weight",           "layers.0.mlp.up_proj.weight",
      "layers.0.mlp.down_proj.weight",           "layers.0.input_layernorm.weight",
      "layers.0.post_attention_layernorm.weight"};
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 11), first_layer);
  const std::vector<std::string> tail = {"norm.weight",
                                         "fc.weight",
                                         "hidden_norm.weight",
                                         "injection.bias",
                                         "injection.readouts.0.weight",
                                         "injection.readouts.1.weight",
                                         "injection.readouts.2.weight",
                                         "injection.writes.0.weight",
                                         "injection.writes.1.weight",
                                         "injection.writes.2.weight",
                                         "injection.message.weight",
                                         "injection.receiver_gate.weight",
                                         "injection.predecessor_gate.weight"};
  EXPECT_EQ(std::vector<std::string>(names.end() - tail.size(), names.end()), tail);
  auto params = draft->named_parameters();
  EXPECT_EQ(params["fc.weight"].sizes(), torch::IntArrayRef({16, 48}));
  EXPECT_EQ(params["injection.writes.1.weight"].sizes(), torch::IntArrayRef({16, 4}));
  EXPECT_EQ(params["injection.message.weight"].sizes(), torch::IntArrayRef({4, 8}));
  EXPECT_TRUE(params["injection.predecessor_gate.weight"].eq(0).all().item<bool>());
  auto buffers = draft->named_buffers();
  ASSERT_EQ(buffers.size(), 2u);
  EXPECT_EQ(buffers["transfer_codes"].sizes(), torch::IntArrayRef({32, 8}));
  EXPECT_EQ(buffers["transfer_codes"].scalar_type(), torch::kFloat32);
  EXPECT_EQ(buffers["transfer_ready"].dim(), 0);
  EXPECT_EQ(buffers["transfer_ready"].scalar_type(), torch::kBool);
}

TEST(DSpineDraft, ZeroWritesGiveBitIdenticalBackboneHiddenStates) {
  const auto c = tiny_config();
  auto draft = initialized_draft(c);
  auto in = block_inputs(c);
  torch::NoGradGuard no_grad;
  auto out = run(*draft, in);

  // The plain DFlash backbone: the same layers without any injection.
  auto x = in.noise;
  auto ctx = draft->context(in.target_hidden);
  auto rope =
      rope_tables(in.position_ids, rope_inv_freq(c.head_dim, c.rope_theta), x.scalar_type());
  auto mask = prepare_attention_mask(in.mask);
  for (auto& layer : draft->layer_modules) x = layer(x, ctx, mask, rope);
  EXPECT_TRUE(torch::equal(out.pre_injection.reshape({2, 8, 16}), x));
  EXPECT_TRUE(torch::equal(out.hidden_states.reshape({2, 8, 16}), draft->norm(x)));
  EXPECT_EQ(out.layer_features.sizes(), torch::IntArrayRef({3, 2, 2, 4, 8}));
}

TEST(DSpineDraft, ForwardWithoutLayerFeaturesGivesTheSameStates) {
  const auto c = tiny_config();
  auto draft = initialized_draft(c);
  torch::NoGradGuard no_grad;
  // Non-zero writes, so the injections change the states the features would be read from.
  for (auto& write : draft->injection->write_layers) write->weight.normal_(0, 0.1);
  draft->injection->predecessor_gate->weight.normal_(0, 0.1);
  auto in = block_inputs(c);
  const auto replace = torch::tensor({{true, false}, {false, true}});
  auto with = run(*draft, in, replace);
  auto without = draft->forward(in.position_ids, in.anchors, in.keep, in.noise, in.target_hidden,
                                in.tokens, replace, /*layer_features=*/false);
  EXPECT_TRUE(torch::equal(without.hidden_states, with.hidden_states));
  EXPECT_TRUE(torch::equal(without.pre_injection, with.pre_injection));
  EXPECT_FALSE(without.layer_features.defined());
}

TEST(DSpineBlockMask, MatchesTheHandCheckedExample) {
  const auto anchors = torch::tensor({{2, 5}, {1, 4}}, torch::kInt64);
  const auto keep = torch::tensor({{true, true}, {true, false}});
  auto mask = block_attention_mask(anchors, keep, 7, 4);
  ASSERT_EQ(mask.sizes(), torch::IntArrayRef({2, 1, 8, 15}));
  auto row = [&](int64_t b, int64_t q) {
    std::string s;
    for (int64_t k = 0; k < 15; ++k) s += mask[b][0][q][k].item<bool>() ? '1' : '.';
    return s;
  };
  EXPECT_EQ(row(0, 0), "11.....1.......");
  EXPECT_EQ(row(0, 3), "11.....1111....");
  EXPECT_EQ(row(0, 4), "11111......1...");
  EXPECT_EQ(row(0, 7), "11111......1111");
  EXPECT_EQ(row(1, 0), "1......1.......");
  EXPECT_EQ(row(1, 3), "1......1111....");
  for (int64_t q = 4; q < 8; ++q) EXPECT_EQ(row(1, q), "...............");
  EXPECT_FALSE(mask[0][0][0].slice(0, 8, 11).any().item<bool>());
}

TEST(DSpineAttention, DroppedBlocksGiveZeroAttentionAndFiniteStates) {
  const auto c = tiny_config();
  auto draft = initialized_draft(c);
  auto in = block_inputs(c);
  auto ctx = draft->context(in.target_hidden);
  auto rope =
      rope_tables(in.position_ids, rope_inv_freq(c.head_dim, c.rope_theta), torch::kFloat32);
  auto& attn = draft->layer_modules[0]->self_attn;
  auto noise = in.noise.clone().requires_grad_(true);
  auto out = attn(noise, ctx, prepare_attention_mask(in.mask), rope);
  EXPECT_TRUE(out[1].slice(0, 4, 8).eq(0).all().item<bool>());
  EXPECT_FALSE(out[1].slice(0, 0, 4).eq(0).all().item<bool>());
  out.sum().backward();
  EXPECT_TRUE(torch::isfinite(noise.grad()).all().item<bool>());
  // A dropped block's own tokens influence nothing through attention.
  EXPECT_TRUE(noise.grad()[1].slice(0, 4, 8).eq(0).all().item<bool>());
}

TEST(DSpineDraft, BlocksAreCausalAndOnlyTheAnchorTokenIsRead) {
  const auto c = tiny_config();
  auto draft = initialized_draft(c);
  randomize_writes(*draft, 0.1);
  auto in = block_inputs(c);
  torch::NoGradGuard no_grad;
  auto base = run(*draft, in);

  auto perturbed = in;
  perturbed.noise = in.noise.clone();
  perturbed.noise.slice(1, 2) += torch::randn_like(perturbed.noise.slice(1, 2));
  auto moved = run(*draft, perturbed);
  for (int64_t b = 0; b < 2; ++b) {
    EXPECT_TRUE(torch::equal(moved.hidden_states[b][0].slice(0, 0, 2),
                             base.hidden_states[b][0].slice(0, 0, 2)));
  }
  EXPECT_FALSE(torch::equal(moved.hidden_states[0][0][2], base.hidden_states[0][0][2]));

  auto relabeled = in;
  relabeled.tokens = in.tokens.clone();
  relabeled.tokens.slice(2, 1) = (in.tokens.slice(2, 1) + 7) % 30;
  auto same = run(*draft, relabeled);
  EXPECT_TRUE(torch::equal(same.hidden_states, base.hidden_states));
  EXPECT_TRUE(torch::equal(same.layer_features, base.layer_features));
}

TEST(DSpineInjection, ReplacementChangesOnlyReplacedBlocksOfEarlyLayers) {
  auto c = tiny_config();
  c.dspine.replacement_layers = 1;
  auto draft = initialized_draft(c);
  randomize_writes(*draft, 0.1);
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  auto h = torch::randn({2, 2, 4, 16});
  auto tokens = torch::randint(0, 30, {2, 2, 4}, torch::kInt64);
  auto replace = torch::tensor({{true, false}, {false, true}});
  auto& inj = *draft->injection;
  for (int64_t layer = 0; layer < 3; ++layer) {
    auto plain = inj.forward(h, layer, tokens, draft->transfer_codes, {}).out;
    auto replaced = inj.forward(h, layer, tokens, draft->transfer_codes, replace).out;
    EXPECT_TRUE(torch::equal(replaced.select(2, 0), h.select(2, 0)));
    EXPECT_TRUE(torch::equal(replaced[0][1], plain[0][1]));
    EXPECT_TRUE(torch::equal(replaced[1][0], plain[1][0]));
    // Slot 1's predecessor is the anchor code either way.
    EXPECT_TRUE(torch::equal(replaced.select(2, 1), plain.select(2, 1)));
    if (layer >= 1) {
      EXPECT_TRUE(torch::equal(replaced, plain));
    } else {
      EXPECT_FALSE(torch::equal(replaced[0][0].slice(0, 2), plain[0][0].slice(0, 2)));
      EXPECT_FALSE(torch::equal(replaced[1][1].slice(0, 2), plain[1][1].slice(0, 2)));
    }
  }
}

// The fused injection reads the written state's feature as readout(h) + rms(h) · messages ·
// (readout · write)ᵀ instead of a readout over H; on the CPU that algebra runs through the ATen
// op, in fp64, against the plain module: the same state, feature and gradients.
TEST(DSpineInjection, FeatureOfTheWriteTakenThroughTheMessagesIsTheReadout) {
  const int64_t hidden = 24, rank = 6, message = 4, layers = 2, positions = 5;
  torch::manual_seed(11);
  AdjacentInjection plain(hidden, rank, message, layers, 1, false);
  AdjacentInjection factored(hidden, rank, message, layers, 1, true);
  plain->to(torch::kFloat64);
  factored->to(torch::kFloat64);
  {
    torch::NoGradGuard no_grad;
    auto source = plain->parameters();
    auto target = factored->parameters();
    for (size_t i = 0; i < source.size(); ++i) target[i].copy_(source[i].normal_(0.0, 0.3));
  }
  const auto options = torch::TensorOptions().dtype(torch::kFloat64);
  const auto h0 = torch::randn({2, 3, positions, hidden}, options);
  const auto tokens = torch::randint(0, 10, {2, 3, positions}, torch::kInt64);
  const auto codes = torch::randn({10, rank}, options);
  const auto replace = torch::tensor({{true, false, true}, {false, false, true}});
  const auto grad_out = torch::randn(h0.sizes(), options);
  const auto grad_feature = torch::randn({2, 3, positions, rank}, options);
  auto run_module = [&](AdjacentInjection& module) {
    auto h = h0.clone().requires_grad_(true);
    auto result = module->forward(h, 0, tokens, codes, replace, /*with_feature=*/true);
    ((result.out * grad_out).sum() + (result.feature * grad_feature).sum()).backward();
    std::vector<torch::Tensor> tensors{result.out.detach(), result.feature.detach(), h.grad()};
    for (auto& p : module->parameters()) {
      tensors.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
    }
    return tensors;
  };
  const auto expected = run_module(plain);
  const auto got = run_module(factored);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_TRUE(torch::equal(got[0], expected[0])) << "the written state";
  for (size_t i = 1; i < got.size(); ++i) {
    EXPECT_TRUE(torch::allclose(got[i], expected[i], 1e-9, 1e-11)) << "tensor " << i;
  }
  EXPECT_GT(expected[1].abs().max().item<double>(), 0.1);
}

TEST(DSpineDraft, RefineOfSlotOneMatchesTheFinalHiddenState) {
  const auto c = tiny_config();
  auto draft = initialized_draft(c);
  randomize_writes(*draft, 0.1);
  auto in = block_inputs(c);
  torch::NoGradGuard no_grad;
  auto out = run(*draft, in);
  auto refined = draft->refine(out.pre_injection.select(2, 1), in.tokens.select(2, 0));
  EXPECT_TRUE(torch::allclose(refined, out.hidden_states.select(2, 1), 1e-5, 1e-5));
}

TEST(DSpineTransferSpace, ToyExampleMatchesTheSpecUpToSigns) {
  auto head = torch::tensor(
      {{2., 0., 1.}, {0., 1., 0.}, {1., 1., 1.}, {3., -1., 0.}, {0., 2., -1.}, {1., 0., -2.}});
  auto space = compute_transfer_space(head, 2, 4);
  EXPECT_TRUE(
      torch::allclose(space.eigenvalues, torch::tensor({1.542691f, 2.292426f}), 1e-5, 1e-5));
  auto gram_row = space.codes.matmul(space.codes.t())[0];
  auto expected_row =
      torch::tensor({1.0, -0.555605, 0.593320, 0.661831, -0.955052, -0.507182}, torch::kFloat32);
  EXPECT_TRUE(torch::allclose(gram_row, expected_row, 1e-5, 1e-5));
  auto projector = space.basis.matmul(space.basis.t());
  auto expected_projector = torch::tensor({{0.375503, -0.434577, 0.213644},
                                           {-0.434577, 0.697586, 0.148671},
                                           {0.213644, 0.148671, 0.926911}},
                                          torch::kFloat32);
  EXPECT_TRUE(torch::allclose(projector, expected_projector, 1e-5, 1e-5));
}

TEST(DSpineTransferSpace, CodesAreUnitWhitenedAndReadoutsAreTheBasis) {
  const auto c = tiny_config();
  torch::manual_seed(17);
  auto head = torch::randn({32, 16});
  auto space = compute_transfer_space(head, 8, 7);
  EXPECT_TRUE(torch::allclose(space.codes.norm(2, -1), torch::ones({32}), 1e-5, 1e-5));
  // Whitened before normalization: Σ_v z_v z_vᵀ = I for z = (n_v − μ)·U / sqrt(λ).
  auto unit = head / head.norm(2, -1, true);
  auto z = (unit - unit.mean(0)).matmul(space.basis) / space.eigenvalues.sqrt();
  EXPECT_TRUE(torch::allclose(z.t().matmul(z), torch::eye(8), 1e-4, 1e-4));
  EXPECT_TRUE(torch::allclose(space.codes, z / z.norm(2, -1, true), 1e-5, 1e-5));

  DSpineDraft draft(c, false);
  EXPECT_FALSE(draft->transfer_ready());
  draft->initialize_transfer_space(head, 7);
  EXPECT_TRUE(draft->transfer_ready());
  EXPECT_TRUE(torch::equal(draft->transfer_codes, space.codes));
  for (auto& readout : draft->injection->readout_layers) {
    EXPECT_TRUE(torch::equal(readout->weight, space.basis.t()));
  }
  EXPECT_FALSE(draft->transfer_codes.requires_grad());
}

TEST(DSpineTransferSpace, ForwardBeforeInitializationNamesTheTransferSpace) {
  const auto c = tiny_config();
  DSpineDraft draft(c, false);
  auto in = block_inputs(c);
  try {
    run(*draft, in);
    FAIL() << "forward before transfer-space init must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("transfer space"), std::string::npos) << e.what();
  }
}

TEST(DSpineTransferSpace, CodesReadoutsAndOutputsSurviveSafetensorsRoundTrip) {
  const auto c = tiny_config();
  auto draft = initialized_draft(c);
  {
    torch::NoGradGuard no_grad;
    draft->injection->readout_layers[0]->weight[0] += 0.2;
  }
  core::NamedTensors tensors;
  for (const auto& p : draft->named_parameters()) tensors.emplace_back(p.key(), p.value());
  for (const auto& b : draft->named_buffers()) tensors.emplace_back(b.key(), b.value());
  const std::string path = ::testing::TempDir() + "/dspine_draft_roundtrip.safetensors";
  core::save_safetensors(path, tensors);
  auto file = core::load_safetensors(path);
  std::remove(path.c_str());

  torch::manual_seed(99);
  DSpineDraft loaded(c, false);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : loaded->named_parameters()) p.value().copy_(file.at(p.key()));
    for (auto& b : loaded->named_buffers()) b.value().copy_(file.at(b.key()));
  }
  EXPECT_TRUE(loaded->transfer_ready());
  EXPECT_TRUE(torch::equal(loaded->transfer_codes, draft->transfer_codes));
  EXPECT_TRUE(torch::equal(loaded->injection->readout_layers[0]->weight,
                           draft->injection->readout_layers[0]->weight));
  auto in = block_inputs(c);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(run(*loaded, in).hidden_states, run(*draft, in).hidden_states));
}

TEST(DSpineConfig, InvalidOptionsAreRejectedNamingDSpine) {
  auto expect_rejected = [](auto mutate) {
    auto c = tiny_config();
    mutate(c);
    try {
      validate_dspine_model_config(c);
      ADD_FAILURE() << "config accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("DSpine"), std::string::npos) << e.what();
    }
  };
  expect_rejected([](DSpineModelConfig& c) { c.dspine.transfer_rank = 17; });
  expect_rejected([](DSpineModelConfig& c) { c.dspine.top_k = 0; });
  expect_rejected([](DSpineModelConfig& c) { c.dspine.message_size = 0; });
  expect_rejected([](DSpineModelConfig& c) { c.dspine.replacement_layers = -1; });
  expect_rejected([](DSpineModelConfig& c) { c.block_size = 1; });
  EXPECT_NO_THROW(validate_dspine_model_config(tiny_config()));
}

// The objective's settings join the model's keys (the objective test checks all eleven).
TEST(DSpineConfig, HfConfigCarriesTheModelKeysAndTheTrainingSettings) {
  auto json = dspine_hf_config(tiny_config(),
                               HfConfigContext{core::Dtype::kFp32, {{"ce_weight", 0.25}}, 8, 12});
  EXPECT_EQ(json["architectures"][0], "DSpineDraftModel");
  EXPECT_EQ(json["dspine_config"].size(), 5u);
  EXPECT_EQ(json["dspine_config"]["transfer_rank"], 8);
  EXPECT_EQ(json["dspine_config"]["ce_weight"], 0.25);
  EXPECT_EQ(json["dflash_config"]["mask_token_id"], 31);
  EXPECT_EQ(json["dflash_config"]["target_layer_ids"], std::vector<int64_t>({1, 4, 6}));
  EXPECT_EQ(json["layer_types"].size(), 3u);
  EXPECT_EQ(json["block_size"], 4);
}

}  // namespace
}  // namespace dspine::model
