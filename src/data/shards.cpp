#include "data/shards.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <type_traits>

#include <nlohmann/json.hpp>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "data/json_integer.h"

namespace dspine::data {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndexFile = "index.json";
constexpr const char* kTargetFile = "target.safetensors";
constexpr const char* kFormat = "dspine-shards";
// Version 2 added each file's size and SHA-256; version 1 indexes are still read, unverified.
constexpr int64_t kFormatVersion = 2;
constexpr int64_t kUncheckedVersion = 1;
constexpr const char* kEmbedKey = "model.embed_tokens.weight";
constexpr const char* kHeadKey = "lm_head.weight";

std::string shard_name(size_t shard) { return fmt::format("shard-{:05d}.safetensors", shard); }

std::string shape_str(at::IntArrayRef shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

at::ScalarType storage_dtype(const std::string& dtype, const std::string& where) {
  if (dtype == "fp32") return at::kFloat;
  if (dtype == "bf16") return at::kBFloat16;
  fail("{}: dtype must be fp32 or bf16, got '{}'", where, dtype);
}

// A required index.json field of type T; errors name the file and the key.
template <typename T>
T field(const nlohmann::json& json, const char* key, const std::string& file) {
  if (!json.contains(key)) fail("{}: missing key '{}'", file, key);
  const nlohmann::json& value = json.at(key);
  bool integers = true;
  if constexpr (std::is_same_v<T, int64_t>) integers = is_int64(value);
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    integers = value.is_array() && std::all_of(value.begin(), value.end(), is_int64);
  }
  try {
    if (integers) return value.get<T>();
  } catch (const nlohmann::json::exception&) {
  }
  fail("{}: key '{}' has the wrong type ({})", file, key, value.dump());
}

// A required integer field of index.json that must be >= 1.
int64_t positive_field(const nlohmann::json& json, const char* key, const std::string& file) {
  const int64_t value = field<int64_t>(json, key, file);
  if (value < 1) fail("{}: key '{}' must be >= 1, got {}", file, key, value);
  return value;
}

// The "bytes" and "sha256" of a version 2 index entry.
core::FileDigest digest_field(const nlohmann::json& json, const std::string& where) {
  core::FileDigest digest{field<int64_t>(json, "bytes", where), field<std::string>(json, "sha256", where)};
  const bool hex = digest.sha256.size() == 64 &&
                   digest.sha256.find_first_not_of("0123456789abcdef") == std::string::npos;
  if (digest.bytes < 0 || !hex) {
    fail("{}: 'bytes' must be >= 0 and 'sha256' 64 lowercase hex digits (got {}, '{}')", where,
         digest.bytes, digest.sha256);
  }
  return digest;
}

nlohmann::json digest_json(const core::FileDigest& digest) {
  return {{"bytes", digest.bytes}, {"sha256", digest.sha256}};
}

void verify_file(const fs::path& path, const core::FileDigest& recorded) {
  if (!fs::is_regular_file(path)) fail("{}: file listed in {} is missing", path.string(), kIndexFile);
  const auto check = core::compare_file_digest(path.string(), recorded);
  if (check.result == core::DigestCheck::kSizeDiffers) {
    fail("{}: {} bytes, but {} records {} (truncated or rewritten); regenerate the shards",
         path.string(), check.found.bytes, kIndexFile, recorded.bytes);
  }
  if (check.result == core::DigestCheck::kHashDiffers) {
    fail("{}: SHA-256 {} differs from {} recorded in {} (corrupt file); regenerate the shards",
         path.string(), check.found.sha256, recorded.sha256, kIndexFile);
  }
}

void check_layout(const ShardLayout& found, const ShardLayout& expected, const std::string& file) {
  const auto mismatch = [&](const char* what, const std::string& have, const char* key,
                            const std::string& want) {
    fail("{}: shards have {} {} but the config has {} = {}", file, what, have, key, want);
  };
  if (found.hidden_size != expected.hidden_size) {
    mismatch("hidden_size", std::to_string(found.hidden_size), "model.hidden_size",
             std::to_string(expected.hidden_size));
  }
  if (found.vocab_size != expected.vocab_size) {
    mismatch("vocab_size", std::to_string(found.vocab_size), "model.vocab_size",
             std::to_string(expected.vocab_size));
  }
  if (found.seq_len != expected.seq_len) {
    mismatch("seq_len", std::to_string(found.seq_len), "data.seq_len",
             std::to_string(expected.seq_len));
  }
  if (found.target_layer_ids != expected.target_layer_ids) {
    mismatch("target_layer_ids", fmt::format("[{}]", fmt::join(found.target_layer_ids, ", ")),
             "model.target_layer_ids",
             fmt::format("[{}]", fmt::join(expected.target_layer_ids, ", ")));
  }
}

void check_tensor(const core::SafetensorsFile& file, const char* name, at::ScalarType dtype,
                  std::vector<int64_t> shape) {
  const at::Tensor& t = file.at(name);
  if (t.scalar_type() != dtype) {
    fail("{}: tensor '{}' has dtype {}, expected {}", file.path, name,
         c10::toString(t.scalar_type()), c10::toString(dtype));
  }
  if (t.sizes() != at::IntArrayRef(shape)) {
    fail("{}: tensor '{}' has shape {}, expected {}", file.path, name, shape_str(t.sizes()),
         shape_str(shape));
  }
}

// The frozen [V, H] weights from target.safetensors as fp32.
at::Tensor read_target_weight(const core::SafetensorsFile& file, const char* name,
                              const ShardLayout& layout) {
  const at::Tensor& t = file.at(name);
  if (!at::isFloatingType(t.scalar_type())) {
    fail("{}: tensor '{}' must be floating point, got {}", file.path, name,
         c10::toString(t.scalar_type()));
  }
  if (t.sizes() != at::IntArrayRef({layout.vocab_size, layout.hidden_size})) {
    fail("{}: tensor '{}' has shape {}, expected [{}, {}] (model.vocab_size, model.hidden_size)",
         file.path, name, shape_str(t.sizes()), layout.vocab_size, layout.hidden_size);
  }
  return t.to(at::kFloat).contiguous();
}

// Shard `shard` of `index` as loaded from its file: tensor names, shapes, dtypes, sample offset
// and token range (errors name the file and the tensor or key).
void check_shard_tensors(const core::SafetensorsFile& file, const ShardIndex& index, size_t shard) {
  const ShardEntry& entry = index.shards.at(shard);
  const std::set<std::string> expected_names = {"input_ids", "loss_mask", "hidden_states",
                                                "target_last_hidden_states"};
  std::set<std::string> names;
  for (const auto& [name, tensor] : file.tensors) names.insert(name);
  if (names != expected_names) {
    fail("{}: holds tensors [{}], expected [{}]", file.path, fmt::join(names, ", "),
         fmt::join(expected_names, ", "));
  }
  const ShardLayout& layout = index.layout;
  const int64_t n = entry.samples, seq = layout.seq_len, hidden = layout.hidden_size;
  const int64_t k = static_cast<int64_t>(layout.target_layer_ids.size());
  const at::ScalarType dtype = storage_dtype(index.dtype, kIndexFile);
  check_tensor(file, "input_ids", at::kLong, {n, seq});
  check_tensor(file, "loss_mask", at::kLong, {n, seq});
  check_tensor(file, "hidden_states", dtype, {n, seq, k * hidden});
  check_tensor(file, "target_last_hidden_states", dtype, {n, seq, hidden});
  const auto offset = file.metadata.find("sample_offset");
  if (offset == file.metadata.end() || offset->second != std::to_string(entry.first_sample)) {
    fail("{}: metadata sample_offset is '{}', but {} places this shard at sample {}", file.path,
         offset == file.metadata.end() ? "(missing)" : offset->second, kIndexFile,
         entry.first_sample);
  }
  const at::Tensor& ids = file.at("input_ids");
  if (ids.min().item<int64_t>() < 0 || ids.max().item<int64_t>() >= layout.vocab_size) {
    fail("{}: input_ids outside the vocabulary [0, {})", file.path, layout.vocab_size);
  }
}

}  // namespace

ShardLayout shard_layout(const core::DataConfig& data, const core::ModelConfig& draft) {
  return ShardLayout{data.seq_len, draft.hidden_size, draft.vocab_size, draft.target_layer_ids};
}

ShardIndex read_shard_index(const std::string& dir) {
  const std::string path = (fs::path(dir) / kIndexFile).string();
  std::ifstream in(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.is_open() || in.bad()) {
    fail("{}: cannot read the shard index (is {} a directory written by `dspine-data generate`?)",
         path, dir);
  }
  return parse_shard_index(text, path);
}

ShardIndex parse_shard_index(const std::string& text, const std::string& path) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
  if (!json.is_object()) fail("{}: expected a JSON object", path);
  const bool is_format = field<std::string>(json, "format", path) == kFormat;
  const int64_t version = field<int64_t>(json, "version", path);
  if (!is_format || (version != kFormatVersion && version != kUncheckedVersion)) {
    fail("{}: not a '{}' index of version {} or {}", path, kFormat, kUncheckedVersion,
         kFormatVersion);
  }
  const bool checksums = version == kFormatVersion;

  ShardIndex index;
  index.layout.seq_len = positive_field(json, "seq_len", path);
  index.layout.hidden_size = positive_field(json, "hidden_size", path);
  index.layout.vocab_size = positive_field(json, "vocab_size", path);
  index.layout.target_layer_ids = field<std::vector<int64_t>>(json, "target_layer_ids", path);
  const auto layers = static_cast<int64_t>(index.layout.target_layer_ids.size());
  // hidden_states rows hold K * hidden_size values.
  if (layers < 1 || index.layout.hidden_size > std::numeric_limits<int64_t>::max() / layers) {
    fail("{}: {} target_layer_ids of hidden_size {} do not make a hidden_states row", path,
         layers, index.layout.hidden_size);
  }
  index.dtype = field<std::string>(json, "dtype", path);
  storage_dtype(index.dtype, path);
  index.num_samples = field<int64_t>(json, "num_samples", path);

  const auto shards = field<nlohmann::json>(json, "shards", path);
  if (!shards.is_array() || shards.empty()) fail("{}: 'shards' must be a non-empty list", path);
  int64_t next_sample = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string where = fmt::format("{} (shards[{}])", path, i);
    ShardEntry entry{field<std::string>(shards[i], "file", where),
                     field<int64_t>(shards[i], "first_sample", where),
                     field<int64_t>(shards[i], "samples", where), std::nullopt};
    if (checksums) entry.digest = digest_field(shards[i], where);
    if (entry.file.empty() || fs::path(entry.file).filename() != entry.file) {
      fail("{}: file '{}' must be a plain file name inside the directory", where, entry.file);
    }
    if (entry.samples < 1 || entry.first_sample != next_sample ||
        entry.samples > std::numeric_limits<int64_t>::max() - next_sample) {
      fail("{}: shard '{}' must hold >= 1 samples starting at sample {} (has first_sample {}, "
           "samples {})", where, entry.file, next_sample, entry.first_sample, entry.samples);
    }
    next_sample += entry.samples;
    index.shards.push_back(std::move(entry));
  }
  if (next_sample != index.num_samples) {
    fail("{}: shards hold {} samples but num_samples is {}", path, next_sample, index.num_samples);
  }
  if (checksums) {
    index.target_digest =
        digest_field(field<nlohmann::json>(json, "target", path), fmt::format("{} (target)", path));
  }
  return index;
}

std::string partial_dir(const std::string& out_dir) {
  fs::path out = fs::path(out_dir).lexically_normal();
  if (!out.has_filename()) out = out.parent_path();
  if (out.empty()) fail("write_shards: empty output directory");
  return (out.parent_path() / (out.filename().string() + ".partial")).string();
}

std::string start_shards(const BatchSource& source, const std::string& out_dir,
                         const ShardWriteOptions& options) {
  if (options.num_samples < 1 || options.samples_per_shard < 1) {
    fail("write_shards: samples ({}) and samples per shard ({}) must be >= 1", options.num_samples,
         options.samples_per_shard);
  }
  storage_dtype(options.dtype, "write_shards");
  const std::string partial = partial_dir(out_dir);
  if (fs::exists(out_dir)) fail("{}: output directory already exists; choose a new one", out_dir);
  core::remove_tree(partial);  // left over from an interrupted run
  fs::create_directories(partial);
  core::save_safetensors((fs::path(partial) / kTargetFile).string(),
                         {{kEmbedKey, source.embed_tokens().to(at::kCPU, at::kFloat)},
                          {kHeadKey, source.lm_head().to(at::kCPU, at::kFloat)}});
  return partial;
}

void write_rank_shards(BatchSource& source, const ShardLayout& layout, const std::string& partial,
                       const ShardWriteOptions& options, int rank, int world_size) {
  const at::ScalarType dtype = storage_dtype(options.dtype, "write_shards");
  const std::string layer_ids = fmt::format("[{}]", fmt::join(layout.target_layer_ids, ","));
  int64_t shard = 0;
  for (int64_t first = 0; first < options.num_samples; first += options.samples_per_shard, ++shard) {
    if (shard % world_size != rank) continue;
    const int64_t count = std::min(options.samples_per_shard, options.num_samples - first);
    source.seek(first);
    const DraftBatch batch = source.next(count).to(at::kCPU);
    const std::string name = shard_name(static_cast<size_t>(shard));
    core::save_safetensors(
        (fs::path(partial) / name).string(),
        {{"input_ids", batch.input_ids},
         {"loss_mask", batch.loss_mask},
         {"hidden_states", batch.hidden_states.to(dtype)},
         {"target_last_hidden_states", batch.target_last_hidden_states.to(dtype)}},
        {{"seq_len", std::to_string(layout.seq_len)},
         {"hidden_size", std::to_string(layout.hidden_size)},
         {"num_target_layers", std::to_string(layout.target_layer_ids.size())},
         {"target_layer_ids", layer_ids},
         {"sample_offset", std::to_string(first)}});
    log::info("wrote {} ({} samples from {}, of {})", name, count, first, options.num_samples);
  }
}

void finish_shards(const core::DataConfig& data, const ShardLayout& layout,
                   const std::string& partial, const std::string& out_dir,
                   const ShardWriteOptions& options) {
  nlohmann::json shards = nlohmann::json::array();
  for (int64_t first = 0; first < options.num_samples; first += options.samples_per_shard) {
    const int64_t count = std::min(options.samples_per_shard, options.num_samples - first);
    const std::string name = shard_name(shards.size());
    nlohmann::json entry = digest_json(core::digest_file((fs::path(partial) / name).string()));
    entry.update({{"file", name}, {"first_sample", first}, {"samples", count}});
    shards.push_back(std::move(entry));
  }
  nlohmann::json index = {
      {"format", kFormat},
      {"version", kFormatVersion},
      {"seq_len", layout.seq_len},
      {"hidden_size", layout.hidden_size},
      {"vocab_size", layout.vocab_size},
      {"target_layer_ids", layout.target_layer_ids},
      {"dtype", options.dtype},
      {"num_samples", options.num_samples},
      {"source", core::to_string(data.source)},
      {"target", digest_json(core::digest_file((fs::path(partial) / kTargetFile).string()))},
      {"shards", shards}};
  // Where the samples came from, for people reading the index.
  if (data.source == core::DataSource::kSynthetic) {
    index["synthetic_seed"] = data.synthetic.seed;
  }
  if (data.source == core::DataSource::kTarget) {
    index["target_path"] = data.target.path;
    index["samples_file"] = data.samples;
  }
  std::ofstream((fs::path(partial) / kIndexFile).string()) << index.dump(2) << "\n";
  fs::rename(partial, fs::path(out_dir).lexically_normal());
}

void write_shards(BatchSource& source, const core::DataConfig& data, const ShardLayout& layout,
                  const std::string& out_dir, const ShardWriteOptions& options) {
  const std::string partial = partial_dir(out_dir);
  if (fs::exists(out_dir)) fail("{}: output directory already exists; choose a new one", out_dir);
  try {
    start_shards(source, out_dir, options);
    write_rank_shards(source, layout, partial, options, 0, 1);
    finish_shards(data, layout, partial, out_dir, options);
  } catch (...) {
    try {
      core::remove_tree(partial);
    } catch (const fs::filesystem_error&) {  // keep the original error
    }
    throw;
  }
}

ShardReader::ShardReader(const std::string& dir, const ShardLayout& expected)
    : dir_(dir), index_(read_shard_index(dir)) {
  check_layout(index_.layout, expected, (fs::path(dir) / kIndexFile).string());
  verify_shard_files(dir, index_);
  const core::SafetensorsFile target = core::load_safetensors((fs::path(dir) / kTargetFile).string());
  embed_tokens_ = read_target_weight(target, kEmbedKey, index_.layout);
  lm_head_ = read_target_weight(target, kHeadKey, index_.layout);
}

void verify_shard_files(const std::string& dir, const ShardIndex& index) {
  if (index.target_digest) {
    verify_file(fs::path(dir) / kTargetFile, *index.target_digest);
  } else {
    log::warn("{}: a version 1 index without checksums; the shard files are not verified "
              "(regenerate them with `dspine-data generate` to get checksums)",
              (fs::path(dir) / kIndexFile).string());
  }
  // Shard by shard: one shard is in memory at a time, and its load right after the hash mostly
  // reads the page cache. Hashing and parsing one in-memory read instead would hold each shard
  // twice (the safetensors parser copies out of its input).
  for (size_t shard = 0; shard < index.shards.size(); ++shard) {
    const ShardEntry& entry = index.shards[shard];
    const fs::path path = fs::path(dir) / entry.file;
    if (entry.digest) {
      verify_file(path, *entry.digest);
    } else if (!fs::is_regular_file(path)) {
      fail("{}: file listed in {} is missing", path.string(), kIndexFile);
    }
    check_shard_tensors(core::load_safetensors(path.string()), index, shard);
  }
}

void ShardReader::seek(int64_t cursor) {
  if (cursor < 0) fail("ShardReader::seek: cursor must be >= 0 (got {})", cursor);
  cursor_ = cursor;
}

core::SafetensorsFile check_shard(core::SafetensorsFile file, const ShardIndex& index,
                                  size_t shard) {
  check_shard_tensors(file, index, shard);
  for (auto& [name, tensor] : file.tensors) {
    if (at::isFloatingType(tensor.scalar_type())) tensor = tensor.to(at::kFloat);
  }
  return file;
}

const core::SafetensorsFile& ShardReader::load_shard(size_t shard) {
  if (cached_shard_ == shard) return cached_;
  const std::string path = (fs::path(dir_) / index_.shards[shard].file).string();
  cached_ = check_shard(core::load_safetensors(path), index_, shard);
  cached_shard_ = shard;
  return cached_;
}

DraftBatch ShardReader::next(int64_t rows) {
  if (rows < 1) fail("ShardReader::next: rows must be >= 1 (got {})", rows);
  std::vector<DraftBatch> pieces;
  for (int64_t remaining = rows; remaining > 0;) {
    const int64_t position = cursor_ % index_.num_samples;  // wraps around: epochs
    const auto it = std::upper_bound(
        index_.shards.begin(), index_.shards.end(), position,
        [](int64_t p, const ShardEntry& entry) { return p < entry.first_sample; });
    const size_t shard = static_cast<size_t>(std::distance(index_.shards.begin(), it)) - 1;
    const ShardEntry& entry = index_.shards[shard];
    const int64_t local = position - entry.first_sample;
    const int64_t take = std::min(remaining, entry.samples - local);
    const core::SafetensorsFile& file = load_shard(shard);
    pieces.push_back(DraftBatch{file.at("input_ids"), file.at("loss_mask"), file.at("hidden_states"),
                                file.at("target_last_hidden_states")}
                         .slice_rows(local, local + take));
    cursor_ += take;
    remaining -= take;
  }
  // concat_rows copies, so the batch never aliases the cached shard.
  return concat_rows(pieces);
}

}  // namespace dspine::data
