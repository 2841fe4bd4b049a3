// The adjacent injection's feature norm (docs/model.md, "Adjacent injection and the transfer
// space"): sqrt(r) · p / ‖p‖ of a readout row p, shared by the training module and the decoding
// path.
#pragma once

namespace dspine::model {

// Below this norm a readout counts as zero (the reference clamps the norm; the fused RMSNorm adds
// r·eps to ‖p‖², eps = kFeatureZeroNorm² / r, which maps p = 0 to 0 and changes nothing above it
// in fp32).
inline constexpr double kFeatureZeroNorm = 1e-12;

// The fused form's eps for rank r.
inline double feature_norm_eps(long long rank) {
  return kFeatureZeroNorm * kFeatureZeroNorm / static_cast<double>(rank);
}

}  // namespace dspine::model
