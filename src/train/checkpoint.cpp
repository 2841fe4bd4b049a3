#include "train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <regex>

#include <fmt/format.h>

#include "core/error.h"
#include "core/files.h"

namespace dspine::train {
namespace fs = std::filesystem;
namespace {

const std::regex kCheckpointPattern("step-([0-9]{6,})");

void write_json(const fs::path& path, const nlohmann::json& value) {
  std::ofstream out(path);
  out << value.dump(2) << "\n";
  out.close();
  if (!out) fail("cannot write {}", path.string());
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.is_open() || in.bad()) fail("checkpoint file {} is missing or unreadable", path.string());
  return text;
}

nlohmann::json parse_json(const std::string& text, const std::string& path) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("checkpoint file {} is not valid JSON: {}", path, e.what());
  }
}

int64_t step_of(const fs::path& directory) {
  std::smatch match;
  const std::string name = directory.filename().string();
  return std::regex_match(name, match, kCheckpointPattern) ? std::stoll(match[1]) : -1;
}

// An integer of the manifest in [minimum, maximum] (maximum >= 0). Checked before get<>, which would truncate
// 1.5, wrap 2^32 into an int, throw its own exceptions and treat 1e300 as undefined behaviour.
int64_t integer_field(const nlohmann::json& state, const char* key, int64_t minimum,
                      int64_t maximum, const std::string& path) {
  const auto value = state.find(key);
  if (value == state.end()) fail("checkpoint file {} has no '{}'", path, key);
  bool in_range = false;
  if (value->is_number_unsigned()) {  // the parser's type for integers >= 0
    const uint64_t number = value->get<uint64_t>();
    in_range = number <= static_cast<uint64_t>(maximum) && static_cast<int64_t>(number) >= minimum;
  } else if (value->is_number_integer()) {
    const int64_t number = value->get<int64_t>();
    in_range = number >= minimum && number <= maximum;
  }
  if (!in_range) {
    fail("checkpoint file {}: '{}' must be an integer in [{}, {}], got {}", path, key, minimum,
         maximum, value->dump());
  }
  return value->get<int64_t>();
}

}  // namespace

std::string checkpoint_name(int64_t step) { return fmt::format("step-{:06d}", step); }

std::string optimizer_shard_name(int rank, int world_size) {
  return fmt::format("optimizer-rank-{:05d}-of-{:05d}.safetensors", rank, world_size);
}

CheckpointManager::CheckpointManager(std::string root, int64_t keep_last,
                                     dist::Communicator& comm)
    : root_(std::move(root)), keep_last_(keep_last), comm_(comm) {}

std::string CheckpointManager::save(int64_t step, const CheckpointContents& contents,
                                    const std::function<void(const std::string&)>& after_file) {
  const bool leader = comm_.rank() == 0;
  const fs::path final_dir = fs::path(root_) / checkpoint_name(step);
  if (fs::exists(final_dir)) {
    fail("checkpoint {} already exists; refusing to overwrite a saved checkpoint",
         final_dir.string());
  }
  // One temporary name all ranks agree on; only the leader creates and renames it.
  const fs::path temp_dir = fs::path(root_) / (".tmp-" + checkpoint_name(step));
  if (leader) {
    fs::create_directories(root_);
    core::remove_tree(temp_dir);
    fs::create_directories(temp_dir);
  }
  comm_.barrier();
  auto done = [&](const std::string& name) {
    if (after_file) after_file(name);
  };
  const std::string shard = optimizer_shard_name(comm_.rank(), comm_.world_size());
  core::save_safetensors((temp_dir / shard).string(), contents.optimizer);
  done(shard);
  if (leader) {
    core::save_safetensors((temp_dir / "model.safetensors").string(), contents.model,
                           {{"format", "pt"}});
    done("model.safetensors");
    write_json(temp_dir / "config.json", contents.model_config);
    done("config.json");
    core::save_safetensors((temp_dir / "rng.safetensors").string(), contents.rng);
    done("rng.safetensors");
  }
  comm_.barrier();  // every shard is complete
  if (leader) {
    auto manifest = contents.trainer_state;
    manifest["world_size"] = comm_.world_size();
    manifest["optimizer_shards"] = comm_.world_size();
    write_json(temp_dir / "trainer_state.json", manifest);
    done("trainer_state.json");
    fs::rename(temp_dir, final_dir);  // the checkpoint becomes visible only when complete
    prune();
  }
  comm_.barrier();
  return final_dir.string();
}

std::vector<std::string> CheckpointManager::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  if (!fs::is_directory(root_)) return {};
  for (const auto& entry : fs::directory_iterator(root_)) {
    const int64_t step = step_of(entry.path());
    if (entry.is_directory() && step >= 0) found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& item : found) paths.push_back(item.second);
  return paths;
}

std::string CheckpointManager::latest() const {
  auto all = list();
  return all.empty() ? std::string() : all.back();
}

void CheckpointManager::remove_incomplete() const {
  if (!fs::is_directory(root_)) return;
  for (const auto& entry : fs::directory_iterator(root_)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 || name.rfind(".trash-", 0) == 0) core::remove_tree(entry.path());
  }
}

void CheckpointManager::prune() const {
  if (keep_last_ <= 0) return;
  auto all = list();
  const auto excess = static_cast<int64_t>(all.size()) - keep_last_;
  for (int64_t i = 0; i < excess; ++i) {
    // Rename first so a crash mid-removal never leaves a partial directory named step-*.
    const fs::path doomed(all[i]);
    const fs::path trash = doomed.parent_path() / (".trash-" + doomed.filename().string());
    core::remove_tree(trash);
    fs::rename(doomed, trash);
    core::remove_tree(trash);
  }
}

TrainerState parse_trainer_state(const std::string& text, const std::string& path) {
  TrainerState state;
  state.json = parse_json(text, path);
  if (!state.json.is_object()) fail("checkpoint file {} must hold a JSON object", path);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  state.saved_world_size = static_cast<int>(
      integer_field(state.json, "optimizer_shards", 1, std::numeric_limits<int>::max(), path));
  state.step = integer_field(state.json, "step", 0, kMax, path);
  state.data_cursor = integer_field(state.json, "data_cursor", 0, kMax, path);
  return state;
}

LoadedCheckpoint load_checkpoint(const std::string& directory, int rank, int world_size,
                                 bool own_shard_only) {
  const fs::path dir(directory);
  if (!fs::is_directory(dir)) fail("checkpoint directory {} does not exist", directory);
  LoadedCheckpoint loaded;
  loaded.path = directory;
  const std::string manifest = (dir / "trainer_state.json").string();
  TrainerState state = parse_trainer_state(read_text(manifest), manifest);
  loaded.trainer_state = std::move(state.json);
  loaded.saved_world_size = state.saved_world_size;
  loaded.step = state.step;
  loaded.data_cursor = state.data_cursor;
  loaded.model = core::load_safetensors((dir / "model.safetensors").string());
  if (own_shard_only && loaded.saved_world_size == world_size) {
    loaded.optimizer.push_back(
        core::load_safetensors((dir / optimizer_shard_name(rank, world_size)).string()));
  } else {
    for (int r = 0; r < loaded.saved_world_size; ++r) {
      loaded.optimizer.push_back(core::load_safetensors(
          (dir / optimizer_shard_name(r, loaded.saved_world_size)).string()));
    }
  }
  loaded.rng = core::load_safetensors((dir / "rng.safetensors").string());
  const std::string config = (dir / "config.json").string();
  loaded.model_config = parse_json(read_text(config), config);
  return loaded;
}

}  // namespace dspine::train
