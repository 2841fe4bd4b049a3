// Loading a trained DSpine draft from outside the run (GSPO's init_from, dspine-eval --weights):
// a checkpoint directory, an exported Hugging Face directory (docs/model.md#export-and-import),
// or a bare draft .safetensors.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

namespace dspine::model {

class DSpineDraftImpl;

// Copies every parameter and both transfer-space buffers from `path` into `draft` (strict: the
// reference keys with the draft's shapes). A directory's config.json, when it has one, must
// describe the draft's configuration (check_hf_config). The transfer space is loaded, never
// rebuilt; a draft whose transfer_ready is false is refused. Errors name the file.
void load_draft(DSpineDraftImpl& draft, const std::string& path);

// A fresh run's draft: its transfer space built from the frozen `lm_head` [V, H], or, when
// `init_from` is set (training.init_from), everything loaded from there by load_draft.
void start_draft(DSpineDraftImpl& draft, const at::Tensor& lm_head, const std::string& init_from);

}  // namespace dspine::model
