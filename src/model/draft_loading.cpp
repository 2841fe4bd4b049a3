#include "model/draft_loading.h"

#include <filesystem>

#include "core/error.h"
#include "core/safetensors.h"
#include "model/dspine_draft.h"
#include "model/hf_draft_config.h"
#include "model/module_state.h"

namespace dspine::model {

void load_draft(DSpineDraftImpl& draft, const std::string& path) {
  namespace fs = std::filesystem;
  const std::string weights = weights_file(path);
  const fs::path config = fs::path(path) / "config.json";
  if (fs::is_directory(path) && fs::exists(config)) {
    check_hf_config(read_json_file(config.string()), draft.config(), config.string());
  }
  load_module_state(draft, core::load_safetensors(weights));
  if (!draft.transfer_ready()) {
    fail("{}: holds a draft whose transfer space was never built (transfer_ready is false)",
         weights);
  }
}

}  // namespace dspine::model
