// Checkpoints: one directory per save (root/step-000100/) written under a temporary name and
// renamed when complete, so a directory named step-* is always whole. Holds the model weights
// (model.safetensors with the reference state-dict keys, consolidated), config.json, one
// optimizer shard per rank (optimizer-rank-00000-of-00002.safetensors: each rank writes its
// own), rng.safetensors and trainer_state.json, the manifest: step, data cursor, world size,
// shard files, run configuration, and the size and SHA-256 of every file ("files"). Rank 0 writes
// the manifest only after every shard is complete.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "dist/communicator.h"

namespace dspine::train {

// What one rank hands to a save: every rank its optimizer shard; rank 0 also the rest.
struct CheckpointContents {
  core::NamedTensors model;
  nlohmann::json model_config;  // config.json (HF-style)
  core::NamedTensors optimizer;  // this rank's shard
  core::NamedTensors rng;
  nlohmann::json trainer_state;
};

// trainer_state.json and the fields of it that a resume reads.
struct TrainerState {
  nlohmann::json json;
  int saved_world_size = 1;  // optimizer_shards
  int64_t step = 0;
  int64_t data_cursor = 0;
};

// Parses the text of trainer_state.json; errors name `path` and the bad field.
TrainerState parse_trainer_state(const std::string& text, const std::string& path);

// The trainer state of `path` when it is a checkpoint directory (it has trainer_state.json);
// nullopt for an export directory or a weights file.
std::optional<TrainerState> checkpoint_state(const std::string& path);

struct LoadedCheckpoint {
  std::string path;
  core::SafetensorsFile model, rng;
  std::vector<core::SafetensorsFile> optimizer;  // rank order, or only this rank's own
  int saved_world_size = 1;
  int64_t step = 0, data_cursor = 0;
  nlohmann::json model_config, trainer_state;
};

class CheckpointManager {
 public:
  // keep_last: complete checkpoints kept after each save (0 = all). Every rank of `comm` takes
  // part in save() (the directory must be on a file system all ranks share).
  CheckpointManager(std::string root, int64_t keep_last, dist::Communicator& comm);

  // Writes root/step-<step>; calls after_file(name) after each file this rank writes (tests use
  // it to interrupt a save). Refuses to replace an existing checkpoint. A rank that cannot write
  // (full disk, no permission) makes every rank fail with an error naming checkpoint.dir and the
  // OS reason; the temporary directory is removed and saved checkpoints stay untouched. Returns
  // the final directory.
  std::string save(int64_t step, const CheckpointContents& contents,
                   const std::function<void(const std::string&)>& after_file = {});

  // The checkpoint a run starts from for checkpoint.resume `setting`, the same on every rank
  // (collective): "" for "none"; for "auto" the newest one that verifies, after setting aside
  // (renaming to .invalid-step-*) each newer one that does not, with a warning; for a directory,
  // that directory, after setting aside (.superseded-step-*) the checkpoints newer than it, which
  // would collide with this run's saves. Nothing is deleted.
  std::string resume_point(const std::string& setting);

  // Complete checkpoints, oldest first.
  std::vector<std::string> list() const;
  // The newest complete checkpoint, or "" when there is none.
  std::string latest() const;
  // Removes what interrupted saves or prunes left behind (.tmp-* / .trash-* directories).
  void remove_incomplete() const;

 private:
  void prune() const;
  std::string newest_valid() const;
  void set_aside_newer_than(const std::string& resume) const;
  std::string root_;
  int64_t keep_last_;
  dist::Communicator& comm_;
};

// Throws dspine::Error naming the first problem of a checkpoint: a malformed manifest, or a
// missing file or one whose size or SHA-256 differs from the manifest's record.
void verify_checkpoint(const std::string& directory);

// The manifest `dspine-data export` writes beside config.json: the size and SHA-256 of the
// export's files, under "files" as a checkpoint's trainer_state.json records them (Hugging Face
// tooling reads config.json and model.safetensors and ignores it).
inline constexpr const char* kExportManifest = "dspine_manifest.json";

// Checks what a draft load reads from `path` (training.init_from, GSPO's init_from, dspine-eval
// --weights, dspine-data export) against the recorded size and SHA-256, before anything is read
// from it: a checkpoint directory's or an export's model.safetensors and config.json, or a
// weights file inside either, against its directory's manifest (trainer_state.json,
// kExportManifest). A directory or file without a manifest records nothing to check. Errors
// word it as verify_checkpoint does: the file, with the measured and the recorded value.
void verify_weights(const std::string& path);

// Reads a checkpoint directory for `rank` of `world_size`: the optimizer shard of that rank
// alone when the world size is unchanged and `own_shard_only`, otherwise every shard (a
// resharding resume). A missing or malformed file, or one whose size or checksum differs from
// the manifest's, is an error naming it.
LoadedCheckpoint load_checkpoint(const std::string& directory, int rank = 0, int world_size = 1,
                                 bool own_shard_only = false);

// "step-000100" for 100.
std::string checkpoint_name(int64_t step);
// "optimizer-rank-00001-of-00002.safetensors".
std::string optimizer_shard_name(int rank, int world_size);

}  // namespace dspine::train
