// safetensors codec: round trips of every dtype and odd shape, the on-disk layout read by hand,
// and one malformed file per validation rule.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "core/error.h"
#include "core/safetensors.h"

namespace dspine::core {
namespace {

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "dspine_test_safetensors_" + name;
}

std::string read_bytes(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), {});
}

// Writes a file with the given header text and data bytes; `header_length` overrides the length
// field when given (for corrupt files).
std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                      int64_t header_length = -1) {
  const std::string path = temp_path(name);
  const uint64_t length = header_length >= 0 ? header_length : header.size();
  std::ofstream file(path, std::ios::binary);
  file.write(reinterpret_cast<const char*>(&length), 8);
  file << header << data;
  return path;
}

std::string load_error(const std::string& path) {
  try {
    load_safetensors(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error loading " << path;
  return "";
}

void expect_same(const at::Tensor& expected, const at::Tensor& actual, const std::string& name) {
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type()) << name;
  EXPECT_EQ(actual.sizes(), expected.sizes()) << name;
  EXPECT_TRUE(actual.device().is_cpu()) << name;
  EXPECT_TRUE(torch::equal(actual, expected.cpu())) << name;
}

NamedTensors every_dtype() {
  torch::manual_seed(0);
  const auto values = torch::randn({3, 5}) * 100;
  return {
      {"f64", values.to(torch::kDouble)},
      {"f32", values.clone()},
      {"f16", values.to(torch::kHalf)},
      {"bf16", values.to(torch::kBFloat16)},
      {"i64", torch::arange(-6, 6, torch::kLong).reshape({2, 6}) * 1000000000000LL},
      {"i32", torch::arange(-4, 4, torch::kInt) * 100000},
      {"i16", torch::arange(-4, 4, torch::kShort) * 1000},
      {"i8", torch::arange(-128, 128, 17, torch::kChar)},
      {"u8", torch::arange(0, 256, 15, torch::kByte)},
      {"bool", torch::tensor({true, false, false, true, true})},
      {"scalar", torch::tensor(2.5)},
      {"empty", torch::zeros({0, 4}, torch::kBFloat16)},
      {"transposed", values.t()},  // non-contiguous input
  };
}

TEST(Safetensors, RoundTripsEveryDtypeAndShapeInOrder) {
  const std::string path = temp_path("every_dtype.safetensors");
  const NamedTensors tensors = every_dtype();
  save_safetensors(path, tensors, {{"format", "pt"}, {"step", "12"}});
  const SafetensorsFile file = load_safetensors(path);
  EXPECT_EQ(file.path, path);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file.tensors[i].first, tensors[i].first);
    expect_same(tensors[i].second, file.tensors[i].second, tensors[i].first);
  }
  EXPECT_EQ(file.at("scalar").dim(), 0);
  EXPECT_EQ(file.at("empty").numel(), 0);
  EXPECT_TRUE(file.at("transposed").is_contiguous());
  EXPECT_EQ(file.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}}));
}

TEST(Safetensors, EmptyFileOfTensorsRoundTrips) {
  const std::string path = temp_path("nothing.safetensors");
  save_safetensors(path, {});
  const SafetensorsFile file = load_safetensors(path);
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.metadata.empty());
}

TEST(Safetensors, WrittenFileFollowsTheSpecLayout) {
  const std::string path = temp_path("layout.safetensors");
  const at::Tensor a = torch::tensor({1.5f, -2.0f, 3.25f});
  const at::Tensor b = torch::tensor({7, 8}, torch::kShort);
  save_safetensors(path, {{"a", a}, {"b", b}}, {{"note", "x"}});

  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  EXPECT_EQ((8 + header_length) % 8, 0u);  // data starts 8-byte aligned
  ASSERT_EQ(bytes.size(), 8 + header_length + 3 * 4 + 2 * 2);
  const auto header = nlohmann::json::parse(bytes.substr(8, header_length));
  EXPECT_EQ(header["__metadata__"]["note"], "x");
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["shape"], nlohmann::json::array({3}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({0, 12}));
  EXPECT_EQ(header["b"]["dtype"], "I16");
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json::array({12, 16}));
  float first = 0;
  std::memcpy(&first, bytes.data() + 8 + header_length, 4);
  EXPECT_EQ(first, 1.5f);
  int16_t last = 0;
  std::memcpy(&last, bytes.data() + 8 + header_length + 14, 2);
  EXPECT_EQ(last, 8);
}

TEST(Safetensors, ReadsAFileWrittenByHand) {
  const float values[2] = {0.5f, -1.0f};
  const std::string path =
      write_raw("by_hand.safetensors",
                R"({"w":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]},"__metadata__":{}})",
                std::string(reinterpret_cast<const char*>(values), 8));
  const SafetensorsFile file = load_safetensors(path);
  EXPECT_TRUE(file.contains("w"));
  EXPECT_FALSE(file.contains("v"));
  EXPECT_TRUE(torch::equal(file.at("w"), torch::tensor({{0.5f}, {-1.0f}})));
}

TEST(Safetensors, SaveLeavesNoTempFileAndReplacesAnOldFile) {
  const std::string path = temp_path("replace.safetensors");
  save_safetensors(path, {{"x", torch::ones({4})}});
  save_safetensors(path, {{"y", torch::zeros({2}, torch::kInt)}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const SafetensorsFile file = load_safetensors(path);
  ASSERT_EQ(file.tensors.size(), 1u);
  EXPECT_EQ(file.tensors[0].first, "y");
}

TEST(Safetensors, SaveIntoMissingDirectoryNamesPathAndLeavesNothing) {
  const std::string path = temp_path("no_such_dir/x.safetensors");
  try {
    save_safetensors(path, {{"x", torch::ones({1})}});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(Safetensors, SaveRejectsBadNamesAndDtypes) {
  const std::string path = temp_path("bad_names.safetensors");
  auto save_error = [&](const NamedTensors& tensors) -> std::string {
    try {
      save_safetensors(path, tensors);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(save_error({{"x", torch::ones({1})}, {"x", torch::ones({1})}})
                .find("'x' is given twice"),
            std::string::npos);
  EXPECT_NE(save_error({{"", torch::ones({1})}}).find("empty name"), std::string::npos);
  EXPECT_NE(save_error({{"__metadata__", torch::ones({1})}}).find("reserved"), std::string::npos);
  EXPECT_NE(save_error({{"c", torch::ones({1}, torch::kComplexFloat)}})
                .find("cannot save tensor 'c'"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(Safetensors, CudaTensorIsSavedFromAHostCopy) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::string path = temp_path("cuda.safetensors");
  const at::Tensor source = torch::arange(12, torch::kFloat).reshape({3, 4});
  save_safetensors(path, {{"g", source.cuda().t()}});
  expect_same(source.t().contiguous(), load_safetensors(path).at("g"), "g");
}

TEST(Safetensors, MissingFileErrorNamesThePath) {
  const std::string path = temp_path("missing.safetensors");
  EXPECT_NE(load_error(path).find(path), std::string::npos);
}

TEST(Safetensors, MissingTensorErrorNamesFileAndTensor) {
  const std::string path = temp_path("at.safetensors");
  save_safetensors(path, {{"x", torch::ones({1})}});
  try {
    load_safetensors(path).at("nope");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'nope'"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, TruncatedFileIsRejected) {
  const std::string path = temp_path("short.safetensors");
  std::ofstream(path, std::ios::binary) << "abc";
  const std::string message = load_error(path);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("truncated safetensors file"), std::string::npos) << message;
}

TEST(Safetensors, HeaderLengthPastTheEndIsRejected) {
  const std::string message =
      load_error(write_raw("long_header.safetensors", "{}      ", "", 1 << 20));
  EXPECT_NE(message.find("header length 1048576 is larger than the 8 bytes"), std::string::npos)
      << message;
}

TEST(Safetensors, InvalidJsonIsRejected) {
  const std::string message = load_error(write_raw("bad_json.safetensors", "{\"a\": [1,", ""));
  EXPECT_NE(message.find("invalid JSON header"), std::string::npos) << message;
}

TEST(Safetensors, UnknownDtypeIsRejected) {
  const std::string message = load_error(write_raw(
      "bad_dtype.safetensors", R"({"t":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", "x"));
  EXPECT_NE(message.find("tensor 't': unknown dtype 'F8'"), std::string::npos) << message;
}

TEST(Safetensors, OffsetsPastTheDataAreRejected) {
  const std::string message = load_error(write_raw(
      "past_end.safetensors", R"({"t":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", "abcd"));
  EXPECT_NE(message.find("data_offsets [0, 8] are out of range: the data section holds 4 bytes"),
            std::string::npos)
      << message;
}

TEST(Safetensors, ShapeNotMatchingOffsetsIsRejected) {
  const std::string message = load_error(write_raw(
      "mismatch.safetensors", R"({"t":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8]}})",
      std::string(8, '\0')));
  EXPECT_NE(message.find("shape [2, 2] of dtype F32 does not match data_offsets [0, 8]"),
            std::string::npos)
      << message;
}

TEST(Safetensors, OverlappingGappedOrUncoveredDataIsRejected) {
  const std::string overlap = load_error(write_raw(
      "overlap.safetensors",
      R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
      R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
      std::string(6, '\0')));
  EXPECT_NE(overlap.find("overlap the previous tensor"), std::string::npos) << overlap;
  const std::string gap = load_error(write_raw(
      "gap.safetensors", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
      std::string(4, '\0')));
  EXPECT_NE(gap.find("leave a gap"), std::string::npos) << gap;
  const std::string trailing = load_error(write_raw(
      "trailing.safetensors", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
      std::string(5, '\0')));
  EXPECT_NE(trailing.find("the tensors cover 2 bytes but the data section holds 5"),
            std::string::npos)
      << trailing;
}

TEST(Safetensors, MalformedEntriesAreRejected) {
  EXPECT_NE(load_error(write_raw("array.safetensors", "[1, 2]", "")).find("must be an object"),
            std::string::npos);
  EXPECT_NE(load_error(write_raw("negative.safetensors",
                                 R"({"t":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", ""))
                .find("shape must hold non-negative integers"),
            std::string::npos);
  EXPECT_NE(load_error(write_raw("no_offsets.safetensors",
                                 R"({"t":{"dtype":"U8","shape":[0]}})", ""))
                .find("needs dtype, shape and data_offsets"),
            std::string::npos);
  EXPECT_NE(load_error(write_raw("bad_bool.safetensors",
                                 R"({"t":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
                                 std::string("\x01\x07", 2)))
                .find("not 0 or 1"),
            std::string::npos);
  EXPECT_NE(load_error(write_raw("bad_meta.safetensors", R"({"__metadata__":{"a":1}})", ""))
                .find("__metadata__ entry 'a' must be a string"),
            std::string::npos);
}

}  // namespace
}  // namespace dspine::core
