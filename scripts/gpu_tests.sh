# The GPU test binaries (tests/gpu and the trainer's tests that run on CUDA), one list for
# scripts/device_check.sh and scripts/pack_device_bundle.sh. Sourced, not run.
# shellcheck disable=SC2034
gpu_tests=(test_fused_norm_mlp test_gspo_gpu test_gspo_policy_gpu test_logit_rows_gpu
  test_dspine_fused_step test_random_source_gpu test_qwen3_model_gpu test_block_attention_gpu
  test_kernel_profile_gpu test_dspine_objective test_trainer test_trainer_start
  test_vocab_objective_gpu test_fused_vocabulary test_injection_residual_gpu test_qk_norm_rope_gpu
  test_master_adamw_gpu test_wgmma_probe_gpu test_cosine_alignment_gpu test_candidate_scores_gpu
  test_gemm_gpu test_draft_decoding_gpu test_speculative_decoder_gpu test_injection_gate_gpu)
