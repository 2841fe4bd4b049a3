// Smoke test of the wgmma kernels without torch (the branch's first GPU check; drop it once the
// real tests have run): the descriptor probe with its offsets as documented and swapped, then the
// block attention's wgmma kernels against its mma.sync kernels at the recipe's shape, and their
// times. Builds in ~15 s on one core, so it can be built here and carried to the GPU machine:
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -DDSPINE_HAS_SM90A \
//     --expt-relaxed-constexpr -Isrc src/kernels/block_attention.cu src/kernels/wgmma_probe.cu \
//     scripts/wgmma_smoke.cu -o wgmma_smoke && ./wgmma_smoke
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/block_attention.h"
#include "kernels/wgmma_probe.h"

using namespace dspine::kernels;
using bf16 = __nv_bfloat16;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { std::printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

std::vector<bf16> randn(size_t n, std::mt19937& g, float scale = 1.f) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<bf16> v(n);
  for (auto& x : v) x = __float2bfloat16(d(g));
  return v;
}
template <typename T> T* upload(const std::vector<T>& v) {
  T* p; cudaMalloc(&p, v.size() * sizeof(T)); cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice); return p;
}
std::vector<float> download_bf16(const bf16* p, size_t n) {
  std::vector<bf16> h(n); cudaMemcpy(h.data(), p, n * 2, cudaMemcpyDeviceToHost);
  std::vector<float> f(n); for (size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]); return f;
}
std::vector<float> download_f32(const float* p, size_t n) {
  std::vector<float> h(n); cudaMemcpy(h.data(), p, n * 4, cudaMemcpyDeviceToHost); return h;
}
void compare(const char* what, const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0, dot = 0, na = 0, nb = 0; size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) { if (std::isfinite(a[i]) != std::isfinite(b[i])) ++bad; continue; }
    num += (a[i] - b[i]) * double(a[i] - b[i]); den += double(b[i]) * b[i];
    dot += double(a[i]) * b[i]; na += double(a[i]) * a[i]; nb += double(b[i]) * b[i];
  }
  std::printf("%-28s rel %.3e cosine %.8f finite-mismatch %zu\n", what, std::sqrt(num / std::max(den, 1e-30)), dot / std::sqrt(std::max(na * nb, 1e-300)), bad);
}


// fp64 reference of the block attention on the host (docs/kernels.md's mask), for a small shape.
struct Reference {
  std::vector<float> out, dq, dk, dv;
};
Reference reference(const BlockAttentionShape& sh, const std::vector<bf16>& q, const std::vector<bf16>& k,
                    const std::vector<bf16>& v, const std::vector<bf16>& dout,
                    const std::vector<int64_t>& anchors, const std::vector<uint8_t>& keep, float scale) {
  const int64_t Q = sh.blocks * sh.block_size, K = sh.context + Q, H = sh.heads, G = sh.kv_heads, D = sh.head_dim;
  auto f = [](bf16 x) { return double(__bfloat162float(x)); };
  Reference r{std::vector<float>(q.size()), std::vector<float>(q.size()), std::vector<float>(k.size()), std::vector<float>(k.size())};
  std::vector<double> dk(k.size()), dv(k.size());
  for (int64_t b = 0; b < sh.rows; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Q; ++i) {
        const int64_t n = i / sh.block_size, j = i % sh.block_size, g = h / (H / G);
        if (!keep[b * sh.blocks + n]) continue;
        std::vector<int64_t> keys;
        for (int64_t c = 0; c < anchors[b * sh.blocks + n]; ++c) keys.push_back(c);
        for (int64_t jj = 0; jj <= j; ++jj) keys.push_back(sh.context + n * sh.block_size + jj);
        const bf16* qi = &q[((b * Q + i) * H + h) * D];
        const bf16* di = &dout[((b * Q + i) * H + h) * D];
        std::vector<double> p(keys.size());
        double mx = -1e300;
        for (size_t t = 0; t < keys.size(); ++t) {
          const bf16* kt = &k[((b * K + keys[t]) * G + g) * D];
          double a = 0; for (int64_t d = 0; d < D; ++d) a += f(qi[d]) * f(kt[d]);
          p[t] = a * scale; mx = std::max(mx, p[t]);
        }
        double sum = 0; for (auto& x : p) { x = std::exp(x - mx); sum += x; }
        for (auto& x : p) x /= sum;
        std::vector<double> o(D, 0.0);
        for (size_t t = 0; t < keys.size(); ++t) {
          const bf16* vt = &v[((b * K + keys[t]) * G + g) * D];
          for (int64_t d = 0; d < D; ++d) o[d] += p[t] * f(vt[d]);
        }
        double delta = 0; for (int64_t d = 0; d < D; ++d) delta += o[d] * f(di[d]);
        std::vector<double> dq(D, 0.0);
        for (size_t t = 0; t < keys.size(); ++t) {
          const int64_t at = ((b * K + keys[t]) * G + g) * D;
          double dp = 0; for (int64_t d = 0; d < D; ++d) dp += f(di[d]) * f(v[at + d]);
          const double ds = p[t] * (dp - delta);
          for (int64_t d = 0; d < D; ++d) {
            dq[d] += scale * ds * f(k[at + d]);
            dk[at + d] += scale * ds * f(qi[d]);
            dv[at + d] += p[t] * f(di[d]);
          }
        }
        for (int64_t d = 0; d < D; ++d) { r.out[((b * Q + i) * H + h) * D + d] = o[d]; r.dq[((b * Q + i) * H + h) * D + d] = dq[d]; }
      }
  for (size_t x = 0; x < dk.size(); ++x) { r.dk[x] = dk[x]; r.dv[x] = dv[x]; }
  return r;
}

int run_against_reference(std::mt19937& gen);

int main() {
  std::mt19937 gen(1);
  std::printf("wgmma available: %d\n", int(wgmma_available()));
  // Probe.
  {
    auto q = randn(64 * 128, gen), k = randn(64 * 128, gen), p = randn(64 * 64, gen, 0.3f), v = randn(64 * 128, gen);
    std::vector<float> s_ref(64 * 64), o_ref(64 * 128);
    for (int i = 0; i < 64; ++i) for (int j = 0; j < 64; ++j) { double a = 0; for (int d = 0; d < 128; ++d) a += double(__bfloat162float(q[i*128+d])) * __bfloat162float(k[j*128+d]); s_ref[i*64+j] = a; }
    for (int i = 0; i < 64; ++i) for (int d = 0; d < 128; ++d) { double a = 0; for (int j = 0; j < 64; ++j) a += double(__bfloat162float(p[i*64+j])) * __bfloat162float(v[j*128+d]); o_ref[i*128+d] = a; }
    bf16 *dq = upload(q), *dk = upload(k), *dp = upload(p), *dv = upload(v);
    float *ds, *dout; cudaMalloc(&ds, 64*64*4); cudaMalloc(&dout, 64*128*4);
    {
      cudaMemset(ds, 0xff, 64*64*4); cudaMemset(dout, 0xff, 64*128*4);
      CK(wgmma_probe(dq, dk, dp, dv, ds, dout, 0)); CK(cudaDeviceSynchronize());
      std::printf("probe:\n");
      compare("  S = Q K^T", download_f32(ds, 64*64), s_ref);
      compare("  O = P V", download_f32(dout, 64*128), o_ref);
    }
  }
  if (run_against_reference(gen)) return 1;
  // Attention at the recipe's shape.
  BlockAttentionShape sh{2, 3072, 512, 16, 32, 8, 128};
  const int64_t queries = sh.blocks * sh.block_size, keys = sh.context + queries;
  auto q = randn(sh.rows * queries * sh.heads * 128, gen), k = randn(sh.rows * keys * sh.kv_heads * 128, gen);
  auto v = randn(sh.rows * keys * sh.kv_heads * 128, gen), dout = randn(sh.rows * queries * sh.heads * 128, gen);
  std::vector<int64_t> anchors;
  for (int b = 0; b < sh.rows; ++b) {
    std::vector<int64_t> perm(sh.context - 1); for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), gen); perm.resize(sh.blocks); std::sort(perm.begin(), perm.end());
    anchors.insert(anchors.end(), perm.begin(), perm.end());
  }
  anchors[0] = 0;
  std::vector<uint8_t> keep(sh.rows * sh.blocks, 1); keep[sh.blocks / 2] = 0;
  bf16 *d_q = upload(q), *d_k = upload(k), *d_v = upload(v), *d_do = upload(dout);
  int64_t* d_anchors = upload(anchors); uint8_t* d_keep = upload(keep);
  const size_t nq = q.size(), nk = k.size(), nstat = sh.rows * queries * sh.heads;
  bf16 *out[2], *dq[2], *dk[2], *dv[2]; float *lse[2], *delta;
  for (int i = 0; i < 2; ++i) { cudaMalloc(&out[i], nq*2); cudaMalloc(&dq[i], nq*2); cudaMalloc(&dk[i], nk*2); cudaMalloc(&dv[i], nk*2); cudaMalloc(&lse[i], nstat*4); }
  cudaMalloc(&delta, nstat*4);
  const float scale = 1.f / std::sqrt(128.f);
  AttentionInstructions sets[2] = {AttentionInstructions::kAutomatic, AttentionInstructions::kMmaSync};
  for (int i = 0; i < 2; ++i) {
    CK(block_attention_forward(sh, d_q, d_k, d_v, d_anchors, d_keep, scale, out[i], lse[i], 0, sets[i]));
    CK(cudaDeviceSynchronize());
  }
  compare("forward out wgmma vs mma", download_bf16(out[0], nq), download_bf16(out[1], nq));
  compare("forward lse wgmma vs mma", download_f32(lse[0], nstat), download_f32(lse[1], nstat));
  for (int i = 0; i < 2; ++i) {
    CK(block_attention_backward(sh, d_q, d_k, d_v, out[1], d_do, lse[1], d_anchors, d_keep, scale, delta, dq[i], dk[i], dv[i], 0, sets[i]));
    CK(cudaDeviceSynchronize());
  }
  compare("dq wgmma vs mma", download_bf16(dq[0], nq), download_bf16(dq[1], nq));
  compare("dk wgmma vs mma", download_bf16(dk[0], nk), download_bf16(dk[1], nk));
  compare("dv wgmma vs mma", download_bf16(dv[0], nk), download_bf16(dv[1], nk));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int i = 0; i < 2; ++i) {
    float f_ms, b_ms;
    for (int w = 0; w < 2; ++w) block_attention_forward(sh, d_q, d_k, d_v, d_anchors, d_keep, scale, out[i], lse[i], 0, sets[i]);
    cudaEventRecord(a); for (int it = 0; it < 10; ++it) block_attention_forward(sh, d_q, d_k, d_v, d_anchors, d_keep, scale, out[i], lse[i], 0, sets[i]);
    cudaEventRecord(b); cudaEventSynchronize(b); cudaEventElapsedTime(&f_ms, a, b);
    cudaEventRecord(a); for (int it = 0; it < 10; ++it) block_attention_backward(sh, d_q, d_k, d_v, out[1], d_do, lse[1], d_anchors, d_keep, scale, delta, dq[i], dk[i], dv[i], 0, sets[i]);
    cudaEventRecord(b); cudaEventSynchronize(b); cudaEventElapsedTime(&b_ms, a, b);
    std::printf("%s: forward %.3f ms, backward %.3f ms, total %.3f ms\n", i == 0 ? "wgmma" : "mma.sync", f_ms / 10, b_ms / 10, (f_ms + b_ms) / 10);
  }
  CK(cudaGetLastError());
  return 0;
}

// Both instruction sets against the fp64 reference on a small shape with unsorted anchors, an
// anchor at 0, a partial context tile and a dropped block.
int run_against_reference(std::mt19937& gen) {
  BlockAttentionShape sh{2, 200, 9, 16, 8, 2, 128};
  const int64_t queries = sh.blocks * sh.block_size, keys = sh.context + queries;
  auto q = randn(sh.rows * queries * sh.heads * 128, gen), k = randn(sh.rows * keys * sh.kv_heads * 128, gen);
  auto v = randn(sh.rows * keys * sh.kv_heads * 128, gen), dout = randn(sh.rows * queries * sh.heads * 128, gen);
  std::vector<int64_t> anchors = {0, 150, 7, 199, 64, 128, 1, 90, 33, 5, 180, 2, 63, 65, 127, 0, 100, 199};
  std::vector<uint8_t> keep(sh.rows * sh.blocks, 1); keep[3] = 0; keep[12] = 0;
  const float scale = 1.f / std::sqrt(128.f);
  const Reference ref = reference(sh, q, k, v, dout, anchors, keep, scale);
  bf16 *d_q = upload(q), *d_k = upload(k), *d_v = upload(v), *d_do = upload(dout);
  int64_t* d_anchors = upload(anchors); uint8_t* d_keep = upload(keep);
  const size_t nq = q.size(), nk = k.size(), nstat = sh.rows * queries * sh.heads;
  bf16 *out, *dq, *dk, *dv; float *lse, *delta;
  cudaMalloc(&out, nq*2); cudaMalloc(&dq, nq*2); cudaMalloc(&dk, nk*2); cudaMalloc(&dv, nk*2); cudaMalloc(&lse, nstat*4); cudaMalloc(&delta, nstat*4);
  for (auto [name, set] : {std::pair{"wgmma", AttentionInstructions::kAutomatic}, std::pair{"mma.sync", AttentionInstructions::kMmaSync}}) {
    CK(block_attention_forward(sh, d_q, d_k, d_v, d_anchors, d_keep, scale, out, lse, 0, set));
    CK(block_attention_backward(sh, d_q, d_k, d_v, out, d_do, lse, d_anchors, d_keep, scale, delta, dq, dk, dv, 0, set));
    CK(cudaDeviceSynchronize());
    std::printf("%s against the fp64 reference:\n", name);
    compare("  out", download_bf16(out, nq), ref.out);
    compare("  dq", download_bf16(dq, nq), ref.dq);
    compare("  dk", download_bf16(dk, nk), ref.dk);
    compare("  dv", download_bf16(dv, nk), ref.dv);
  }
  return 0;
}
