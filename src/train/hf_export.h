// `dspine-data export`: a trained DSpine draft in the Hugging Face layout that SpecForge and
// serving engines read (docs/model.md#export-and-import): config.json with every key of the
// reference draft config, and model.safetensors with exactly the reference state-dict keys.
#pragma once

#include <cstdint>
#include <string>

namespace dspine::train {

struct ExportSummary {
  int64_t tensors = 0;
  std::string dtype;  // of the parameters, as config.json names it: float32 | bfloat16
};

// Writes `out_dir` from the draft in `source_dir`: a training checkpoint or an exported directory
// (what is read is first verified against its manifest's sizes and SHA-256, verify_weights), and
// kExportManifest beside config.json for the loads of the export. The tensors keep their bytes and
// dtype; config.json is the source's, completed (block_size in dflash_config, all eleven
// dspine_config fields, num_target_layers, ...). Refuses an existing `out_dir`; writes into a
// temporary sibling directory and renames it, so `out_dir` is either whole or absent. Errors name
// the file and what is wrong (not a DSpine draft, a missing or misshapen tensor, a transfer space
// never built, a non-finite value).
ExportSummary export_draft(const std::string& source_dir, const std::string& out_dir);

}  // namespace dspine::train
