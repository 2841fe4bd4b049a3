// Loading a trained DSpine draft from outside the run (training.init_from, GSPO's init_from,
// dspine-eval --weights; the draft registry's dspine entry, model/draft_registry.h): a checkpoint
// directory, an exported Hugging Face directory (docs/model.md#export-and-import), or a bare draft
// .safetensors.
#pragma once

#include <string>

namespace dspine::model {

class DSpineDraftImpl;

// Copies every parameter and both transfer-space buffers from `path` into `draft` (strict: the
// reference keys with the draft's shapes). A directory's config.json, when it has one, must
// describe the draft's configuration (check_hf_config). The transfer space is loaded, never
// rebuilt; a draft whose transfer_ready is false is refused. Errors name the file.
void load_draft(DSpineDraftImpl& draft, const std::string& path);

}  // namespace dspine::model
