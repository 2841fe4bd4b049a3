#include "train/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <regex>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "core/checksum.h"
#include "core/error.h"
#include "core/files.h"
#include "core/log.h"

namespace dspine::train {
namespace fs = std::filesystem;
namespace {

const std::regex kCheckpointPattern("step-([0-9]{6,})");

void write_json(const fs::path& path, const nlohmann::json& value) {
  std::ofstream out(path);
  out << value.dump(2) << "\n";
  out.close();
  if (!out) fail("cannot write {}: {}", path.string(), std::strerror(errno));
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

// Runs `work` on this rank and tells every rank whether any rank's work failed (a collective):
// a rank that cannot write must not leave the others waiting in the next barrier. Returns this
// rank's error, "" when its own work succeeded.
std::string run_everywhere(dist::Communicator& comm, const std::function<void()>& work,
                           bool& any_failed) {
  std::string error;
  try {
    work();
  } catch (const std::exception& e) {
    error = e.what();
  }
  auto failed = at::full({1}, error.empty() ? 0 : 1, at::kInt);
  comm.all_reduce(failed, dist::ReduceOp::kMax);
  any_failed = failed.item<int>() != 0;
  return error;
}

// Tests make a save die mid-way (scripts/soak_resume.sh): DSPINE_TEST_KILL_AFTER_FILE=<file name>
// kills the process that has just written that file.
void kill_if_asked_after(const std::string& name) {
  const char* target = std::getenv("DSPINE_TEST_KILL_AFTER_FILE");
  if (target != nullptr && name == target) ::raise(SIGKILL);
}

// The size and SHA-256 of each rank's optimizer shard, gathered on every rank: fixed-size
// records (8 bytes of size, 64 hex digits) so one all-gather moves them.
std::vector<core::FileDigest> gather_digests(dist::Communicator& comm,
                                             const core::FileDigest& mine) {
  constexpr int64_t kRecord = 8 + 64;
  auto local = at::zeros({kRecord}, at::kByte);
  std::memcpy(local.data_ptr(), &mine.bytes, 8);
  std::memcpy(local.data_ptr<uint8_t>() + 8, mine.sha256.data(),
              std::min<size_t>(64, mine.sha256.size()));
  auto all = at::empty({comm.world_size() * kRecord}, at::kByte);
  comm.all_gather(local, all);
  std::vector<core::FileDigest> digests(comm.world_size());
  for (int r = 0; r < comm.world_size(); ++r) {
    const auto* record = all.data_ptr<uint8_t>() + r * kRecord;
    std::memcpy(&digests[r].bytes, record, 8);
    digests[r].sha256.assign(reinterpret_cast<const char*>(record) + 8, 64);
  }
  return digests;
}

nlohmann::json digest_json(const core::FileDigest& digest) {
  return {{"bytes", digest.bytes}, {"sha256", digest.sha256}};
}

// A directory's record of its files' sizes and SHA-256 ("files": {name: {bytes, sha256}}), and
// how errors name it: a checkpoint's trainer_state.json or an export's kExportManifest.
struct Manifest {
  nlohmann::json json;
  std::string name;  // the manifest's file name
  std::string kind;  // "checkpoint" | "export"
};

Manifest checkpoint_manifest(nlohmann::json state) {
  return {std::move(state), "trainer_state.json", "checkpoint"};
}

// Checks one file against its manifest entry; a manifest without "files" (checkpoints written
// before checksums) only requires the file to exist.
void verify_file(const fs::path& dir, const std::string& name, const Manifest& manifest) {
  const fs::path path = dir / name;
  const std::string where = path.string();
  const char* kind = manifest.kind.c_str();
  if (!fs::is_regular_file(path)) fail("{} file {} is missing", kind, where);
  const auto files = manifest.json.find("files");
  if (files == manifest.json.end()) return;
  const auto entry = files->is_object() ? files->find(name) : files->end();
  if (entry == files->end() || !entry->is_object() || !entry->contains("bytes") ||
      !entry->contains("sha256") || !(*entry)["bytes"].is_number_integer() ||
      !(*entry)["sha256"].is_string()) {
    fail("{} file {}: the manifest ({}) has no valid entry for it", kind, where, manifest.name);
  }
  const core::FileDigest recorded{(*entry)["bytes"].get<int64_t>(),
                                  (*entry)["sha256"].get<std::string>()};
  const auto check = core::compare_file_digest(where, recorded);
  if (check.result == core::DigestCheck::kSizeDiffers) {
    fail("{} file {} has {} bytes, the manifest records {} (truncated or replaced)", kind, where,
         check.found.bytes, recorded.bytes);
  }
  if (check.result == core::DigestCheck::kHashDiffers) {
    fail("{} file {} is corrupt: its SHA-256 is {}, the manifest records {}", kind, where,
         check.found.sha256, recorded.sha256);
  }
}

// The manifest of `dir`: its trainer_state.json (a checkpoint), else its kExportManifest (an
// export); nullopt when it has neither.
std::optional<Manifest> manifest_of(const fs::path& dir) {
  const fs::path state = dir / "trainer_state.json";
  if (fs::is_regular_file(state)) {
    return checkpoint_manifest(parse_trainer_state(read_text(state), state.string()).json);
  }
  const fs::path exported = dir / kExportManifest;
  if (!fs::is_regular_file(exported)) return std::nullopt;
  const std::string path = exported.string();
  Manifest manifest{parse_json(read_text(exported), path), kExportManifest, "export"};
  if (!manifest.json.is_object()) fail("export file {} must hold a JSON object", path);
  return manifest;
}

// Renames a checkpoint directory out of the step-* namespace (never deletes it):
// root/.<label>-step-000040-20260101T120000, with a counter if that name is taken.
std::string set_aside(const fs::path& directory, const std::string& label) {
  char stamp[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", std::gmtime(&now));
  const std::string base = fmt::format(".{}-{}-{}", label, directory.filename().string(), stamp);
  fs::path target = directory.parent_path() / base;
  for (int n = 1; fs::exists(target); ++n) {
    target = directory.parent_path() / fmt::format("{}-{}", base, n);
  }
  fs::rename(directory, target);
  return target.string();
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
  auto done = [&](const std::string& name) {
    if (after_file) after_file(name);
    kill_if_asked_after(name);
  };
  // Every stage ends with all ranks agreeing it succeeded; a failure (full disk, no permission)
  // removes the temporary directory and leaves the checkpoints already saved untouched.
  auto stage = [&](const std::function<void()>& work) {
    bool any_failed = false;
    const std::string error = run_everywhere(comm_, work, any_failed);
    if (!any_failed) return;
    if (leader) {
      try {
        core::remove_tree(temp_dir.string());
      } catch (const std::exception&) {  // the error below matters more
      }
    }
    fail("cannot save checkpoint {} in checkpoint.dir {}: {}", checkpoint_name(step), root_,
         error.empty() ? "another rank failed to write its part" : error);
  };
  stage([&] {
    if (!leader) return;
    fs::create_directories(root_);
    core::remove_tree(temp_dir.string());
    fs::create_directories(temp_dir);
  });
  nlohmann::json files = nlohmann::json::object();
  auto write = [&](const std::string& name, const std::function<void(const std::string&)>& writer) {
    const std::string path = (temp_dir / name).string();
    writer(path);
    const auto digest = core::digest_file(path);  // what this rank wrote, as written
    files[name] = digest_json(digest);
    done(name);
    return digest;
  };
  core::FileDigest shard_digest;
  stage([&] {
    shard_digest = write(optimizer_shard_name(comm_.rank(), comm_.world_size()),
                         [&](const std::string& path) {
                           core::save_safetensors(path, contents.optimizer);
                         });
    if (!leader) return;
    write("model.safetensors", [&](const std::string& path) {
      core::save_safetensors(path, contents.model, {{"format", "pt"}});
    });
    write("config.json", [&](const std::string& path) { write_json(path, contents.model_config); });
    write("rng.safetensors",
          [&](const std::string& path) { core::save_safetensors(path, contents.rng); });
  });
  const auto shards = gather_digests(comm_, shard_digest);  // every shard is complete
  stage([&] {
    if (!leader) return;
    for (int r = 0; r < comm_.world_size(); ++r) {
      files[optimizer_shard_name(r, comm_.world_size())] = digest_json(shards[r]);
    }
    auto manifest = contents.trainer_state;
    manifest["world_size"] = comm_.world_size();
    manifest["optimizer_shards"] = comm_.world_size();
    manifest["files"] = files;
    write_json(temp_dir / "trainer_state.json", manifest);
    done("trainer_state.json");
    fs::rename(temp_dir, final_dir);  // the checkpoint becomes visible only when complete
    prune();
  });
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

std::string CheckpointManager::resume_point(const std::string& setting) {
  if (setting == "none") return "";
  // The leader validates and renames; the others take its choice (-1: start fresh).
  auto chosen = at::full({1}, int64_t{-1}, at::kLong);
  bool any_failed = false;
  const std::string error = run_everywhere(comm_, [&] {
    if (comm_.rank() != 0) return;
    if (setting != "auto") {
      verify_checkpoint(setting);  // here, so that every rank fails alike on a bad one
      set_aside_newer_than(setting);
    } else if (const std::string found = newest_valid(); !found.empty()) {
      chosen.fill_(step_of(found));
    }
  }, any_failed);
  if (any_failed) {
    fail("cannot resume (checkpoint.resume: {}) in checkpoint.dir {}: {}", setting, root_,
         error.empty() ? "rank 0 failed, see its error" : error);
  }
  if (setting != "auto") return setting;
  comm_.broadcast(chosen, 0);
  const int64_t step = chosen.item<int64_t>();
  return step < 0 ? std::string() : (fs::path(root_) / checkpoint_name(step)).string();
}

std::string CheckpointManager::newest_valid() const {
  auto all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      verify_checkpoint(*it);
      return *it;
    } catch (const Error& e) {
      const std::string moved = set_aside(*it, "invalid");
      log::warn("skipping checkpoint {}: {}; moved it to {}", *it, e.what(), moved);
    }
  }
  return "";
}

void CheckpointManager::set_aside_newer_than(const std::string& resume) const {
  const std::string manifest = (fs::path(resume) / "trainer_state.json").string();
  const int64_t step = parse_trainer_state(read_text(manifest), manifest).step;
  std::error_code same_error;
  for (const auto& path : list()) {
    if (step_of(path) <= step || fs::equivalent(path, resume, same_error)) continue;
    // A newer checkpoint would collide with this run's saves, and "auto" would pick it later.
    const std::string moved = set_aside(path, "superseded");
    log::warn("resuming from {} (step {}): moved the newer checkpoint {} to {}", resume, step,
              path, moved);
  }
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

std::optional<TrainerState> checkpoint_state(const std::string& path) {
  const fs::path manifest = fs::path(path) / "trainer_state.json";
  if (!fs::is_regular_file(manifest)) return std::nullopt;
  return parse_trainer_state(read_text(manifest), manifest.string());
}

void verify_checkpoint(const std::string& directory) {
  const fs::path dir(directory);
  if (!fs::is_directory(dir)) fail("checkpoint directory {} does not exist", directory);
  const std::string state_path = (dir / "trainer_state.json").string();
  const TrainerState state = parse_trainer_state(read_text(state_path), state_path);
  const Manifest manifest = checkpoint_manifest(state.json);
  for (const char* name : {"model.safetensors", "config.json", "rng.safetensors"}) {
    verify_file(dir, name, manifest);
  }
  for (int r = 0; r < state.saved_world_size; ++r) {
    verify_file(dir, optimizer_shard_name(r, state.saved_world_size), manifest);
  }
}

void verify_weights(const std::string& path) {
  const fs::path weights(path);
  const bool directory = fs::is_directory(weights);
  fs::path dir = directory ? weights : weights.parent_path();
  if (dir.empty()) dir = ".";
  const auto manifest = manifest_of(dir);
  if (!manifest) return;
  if (!directory) {
    verify_file(dir, weights.filename().string(), *manifest);
    return;
  }
  // What the draft registry's load reads from a directory (model/draft_loading.h).
  for (const char* name : {"model.safetensors", "config.json"}) verify_file(dir, name, *manifest);
}

LoadedCheckpoint load_checkpoint(const std::string& directory, int rank, int world_size,
                                 bool own_shard_only) {
  const fs::path dir(directory);
  if (!fs::is_directory(dir)) fail("checkpoint directory {} does not exist", directory);
  LoadedCheckpoint loaded;
  loaded.path = directory;
  const std::string state_path = (dir / "trainer_state.json").string();
  TrainerState state = parse_trainer_state(read_text(state_path), state_path);
  loaded.trainer_state = std::move(state.json);
  loaded.saved_world_size = state.saved_world_size;
  loaded.step = state.step;
  loaded.data_cursor = state.data_cursor;
  // Every file is checked against the manifest's size and checksum before it is parsed.
  const Manifest manifest = checkpoint_manifest(loaded.trainer_state);
  auto read_safetensors = [&](const std::string& name) {
    verify_file(dir, name, manifest);
    return core::load_safetensors((dir / name).string());
  };
  loaded.model = read_safetensors("model.safetensors");
  if (own_shard_only && loaded.saved_world_size == world_size) {
    loaded.optimizer.push_back(read_safetensors(optimizer_shard_name(rank, world_size)));
  } else {
    for (int r = 0; r < loaded.saved_world_size; ++r) {
      loaded.optimizer.push_back(
          read_safetensors(optimizer_shard_name(r, loaded.saved_world_size)));
    }
  }
  loaded.rng = read_safetensors("rng.safetensors");
  verify_file(dir, "config.json", manifest);
  const std::string config = (dir / "config.json").string();
  loaded.model_config = parse_json(read_text(config), config);
  return loaded;
}

}  // namespace dspine::train
