"""scripts/profile_by_op.py on a hand-built Chrome trace: --syncs names the operator that waited,
how long it waited and how long the GPU then sat idle; --gaps charges an idle stretch to the
launch that ended it; --gemms sums GEMM kernels by operator shapes; the default table sums
kernels by the scope that launched them, a kernel no operator claims by the scope of its launch."""
import json
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "profile_by_op.py"


def event(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid, "args": args}


# Host: a forward scope launching two kernels, then an item() whose copy waits for the GPU
# (100 us) inside the objective's scope. GPU: kernel A 0-50, kernel B 60-160, kernel C from 400
# (launched by a later operator): idle 10 us after A and 240 us after the synchronisation.
TRACE = {"traceEvents": [
    event("user_annotation", "dspine.attention", 0, 40),
    event("cpu_op", "aten::mm", 5, 10,
          **{"External id": 1, "Input Dims": [[512, 1024], [1024, 256]]}),
    event("cpu_op", "aten::add", 20, 10, **{"External id": 2}),
    event("user_annotation", "dspine.vocab_objective", 50, 150),
    event("cpu_op", "aten::_local_scalar_dense", 60, 120, **{"External id": 3}),
    event("cuda_runtime", "cudaMemcpyAsync", 62, 90),
    event("cuda_runtime", "cudaStreamSynchronize", 155, 5),
    event("cpu_op", "aten::mul", 390, 5, **{"External id": 4}),
    event("user_annotation", "dspine.mlp", 200, 50),
    event("cuda_runtime", "cudaLaunchKernel", 210, 5, correlation=9),
    event("kernel", "void gemm_kernel<float>(int)", 0, 50, tid=7, **{"External id": 1}),
    event("kernel", "void at::native::vectorized_elementwise_kernel<4>()", 60, 100, tid=7,
          **{"External id": 2}),
    event("kernel", "void at::native::vectorized_elementwise_kernel<4>()", 400, 20, tid=7,
          **{"External id": 4}),
    # A kernel of the project's own, launched inside a custom autograd function: no operator
    # claims it, its runtime call (matched by correlation id) lies in the dspine.mlp scope.
    event("kernel", "void dspine::kernels::swiglu_forward_kernel<bf16>()", 430, 30, tid=7,
          correlation=9),
]}


class ProfileByOp(unittest.TestCase):
    def run_script(self, *flags):
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "trace.json"
            path.write_text(json.dumps(TRACE))
            return subprocess.run([sys.executable, str(SCRIPT), str(path), *flags], check=True,
                                  capture_output=True, text=True).stdout

    def test_syncs_name_the_waiting_operator_and_the_idle_gpu_after(self):
        out = self.run_script("--syncs")
        self.assertIn("| 0.15 | 0.12 | 0.24 | dspine.vocab_objective | aten::_local_scalar_dense |",
                      out)
        self.assertIn("1 synchronisations; the GPU idle after them: 0.24 ms", out)

    def test_gaps_are_charged_to_the_launch_after_them(self):
        out = self.run_script("--gaps")
        self.assertIn("GPU idle in gaps over 20 us: 0.24 ms", out)
        self.assertIn("| (no scope) | aten::mul | 0.24 | 1 |", out)

    def test_kernels_are_summed_by_launching_scope(self):
        out = self.run_script()
        self.assertIn("| dspine.attention | 0.15 |", out)
        self.assertIn("| dspine.attention | aten::add | vectorized_elementwise_kernel | 0.10 | 1 |",
                      out)

    def test_a_kernel_no_operator_claims_goes_to_the_scope_of_its_launch(self):
        out = self.run_script("--category", "elementwise")
        self.assertIn("| dspine.mlp | dspine.mlp | swiglu_forward_kernel | 0.03 | 1 |", out)
        self.assertNotIn("(unlinked)", out)

    def test_gemms_are_summed_by_shapes_with_their_rate(self):
        out = self.run_script("--gemms")
        # 2 * 512 * 1024 * 256 FLOP in 50 us: 5.4 TFLOP/s.
        self.assertIn("GEMM kernel time 0.1 ms", out)
        self.assertIn("| dspine.attention | aten::mm | [[512,1024],[1024,256]] | 0.05 | 1 | 5 |",
                      out)


if __name__ == "__main__":
    unittest.main()
