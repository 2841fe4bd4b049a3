// Comparators of the parity tests (a fused kernel or another path against its reference). Each
// measures in fp64, exact for fp32 and bf16 inputs, with `expected` moved to `actual`'s device.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace dspine::testing {

// Both tensors in fp64 on `actual`'s device.
inline std::pair<at::Tensor, at::Tensor> in_fp64(const at::Tensor& actual,
                                                 const at::Tensor& expected) {
  return {actual.to(torch::kFloat64), expected.to(actual.device(), torch::kFloat64)};
}

// max |actual − expected| over the elements.
inline double max_abs_diff(const at::Tensor& actual, const at::Tensor& expected) {
  const auto [a, e] = in_fp64(actual, expected);
  return (a - e).abs().max().item<double>();
}

// max |actual − expected| over the reference's scale, max(floor, max |expected|): floor 1 keeps
// an absolute tolerance near zero; floor 0 is purely relative (the reference must not be all 0).
inline double max_relative_diff(const at::Tensor& actual, const at::Tensor& expected,
                                double floor) {
  const auto [a, e] = in_fp64(actual, expected);
  return (a - e).abs().max().item<double>() / std::max(floor, e.abs().max().item<double>());
}

// ‖actual − expected‖₂ / ‖expected‖₂ over the whole tensor (the bf16 kernels' measure), the
// reference's norm floored at 1e-30.
inline double norm_relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  const auto [a, e] = in_fp64(actual, expected);
  return ((a - e).norm() / e.norm().clamp_min(1e-30)).item<double>();
}

// The cosine of the angle between the two tensors as vectors, the norms' product floored at 1e-30.
inline double cosine(const at::Tensor& actual, const at::Tensor& expected) {
  const auto [a, e] = in_fp64(actual, expected);
  return (a.flatten().dot(e.flatten()) / (a.norm() * e.norm()).clamp_min(1e-30)).item<double>();
}

// Same shape, and every element within `tolerance` of the reference's scale (its largest
// magnitude, at least 1): max_relative_diff(actual, expected, 1) ≤ tolerance.
inline void expect_close(const at::Tensor& actual, const at::Tensor& expected, double tolerance,
                         const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double diff = max_relative_diff(actual, expected, 1.0);
  EXPECT_LE(diff, tolerance) << what
                             << ": max |actual - expected| / max(1, max |expected|) = " << diff
                             << ", tolerance " << tolerance;
}

// max over the elements of |actual − expected| − (rtol·|expected| + atol), torch::allclose's bound
// per element: ≤ 0 when every element is within it. NaN anywhere, or an infinity on both sides
// (which allclose would pass), gives NaN, which fails every comparison.
inline double allclose_excess(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                              double atol) {
  const auto [a, e] = in_fp64(actual, expected);
  return ((a - e).abs() - (e.abs() * rtol + atol)).max().item<double>();
}

// Same shape, and every element within rtol·|expected| + atol of the reference
// (allclose_excess ≤ 0), in fp64: the per-element measure, where expect_close scales by the
// reference's largest magnitude.
inline void expect_allclose(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                            double atol, const std::string& what) {
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  const double excess = allclose_excess(actual, expected, rtol, atol);
  EXPECT_LE(excess, 0.0) << what
                         << ": max (|actual - expected| - rtol |expected| - atol) = " << excess
                         << " (max |actual - expected| " << max_abs_diff(actual, expected)
                         << "), rtol " << rtol << ", atol " << atol;
}

// Two module states (model::module_state) alike bitwise: the same names in the same order, and
// each tensor of the same dtype and values.
inline void expect_same_state(const std::vector<std::pair<std::string, at::Tensor>>& actual,
                              const std::vector<std::pair<std::string, at::Tensor>>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [name, tensor] = expected[i];
    EXPECT_EQ(actual[i].first, name);
    EXPECT_EQ(actual[i].second.scalar_type(), tensor.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(actual[i].second, tensor)) << name;
  }
}

}  // namespace dspine::testing
