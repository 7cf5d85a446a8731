# ruff: noqa: E501  (test node ids are as long as their parameters make them)
"""The tests that run in `make test-all` only, each with default tests that cover its path.

`make test` stays short on the two-core machines CI uses; `make test-all` runs
everything. A test is listed here only where the default suite executes every
line of the library (`date_optax/`, `examples/`, `benchmarks/`) that the test
executes: measured per test with coverage.py over a whole `make test-all`-style
run (`benchmarks/suite_coverage.py` prints these sets and checks a list against
them). Beside each test, the default tests whose lines together contain its
lines (the same family first). What the listed test adds is its own values
(another optimizer, format or layout through the same code), which `make
test-all` still checks.

`tests/conftest.py` marks each of these `slow`; a name here that the suite no
longer collects fails the collection.
"""

MOVED: dict[str, tuple[str, ...]] = {
    # test_sharded_transforms.py
    'test_sharded_transforms.py::test_sharded_equals_unsharded[trust_ratio-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[trust_ratio-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[trust_ratio-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[trust_ratio-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lamb-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lamb-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lamb-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lamb-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[date-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[date-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[bounded_lars-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[bounded_lars-explicit-eager]',
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[bounded_lars-explicit-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[bounded_lars-explicit-eager]',
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lars-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lars-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars-explicit-jit]',
    ),
    # test_update_structure.py
    'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[lamb]': (
        'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[lars]',
        'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[date(adam)]',
        'test_update_structure.py::test_lamb_holds_one_large_layers_direction_at_a_time',
    ),
    'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[bounded_lars]': (
        'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[date(momentum)]',
        'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[lars]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(adam)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(rmsprop)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[date(adam)]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(adagrad)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(rmsprop)]',
        'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[adagrad-options2]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio(norm_of_sum)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(rmsprop)]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio(adam)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars(nesterov,masks,bounds)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio(norm_of_sum)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(rmsprop)]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio(adam,gradient)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio(norm_of_sum)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(rmsprop)]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lamb(nvlamb,decoupled)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lamb]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(adam,update)]',
        'test_transforms.py::test_lamb_on_repeated_small_leaves_matches_reference[False-True]',
        'test_transforms.py::test_lamb_on_repeated_small_leaves_matches_reference[True-False]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars(norm_of_sum)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio(norm_of_sum)]',
    ),
    # test_collective_rounds.py
    'test_collective_rounds.py::test_stochastic_torus_draws_the_ranks_of_the_unrolled_rounds[2x4-plain]': (
        'test_collective_rounds.py::test_stochastic_torus_draws_the_ranks_of_the_unrolled_rounds[1x8-plain]',
        'test_collective_rounds.py::test_stochastic_torus_draws_the_ranks_of_the_unrolled_rounds[2x4-scaled]',
    ),
    # test_grad_sync.py
    'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[int8-torus]': (
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[int8-ring]',
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-torus]',
    ),
    'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[int8-psum]': (
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[int8-ring]',
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-psum]',
        'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[int8_aps_ring]',
        'test_error_feedback.py::test_two_stage_error_feedback_matches_numpy[psum-True]',
    ),
    'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-ring]': (
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-torus]',
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[int8-ring]',
        'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[ring]',
    ),
    'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[int8_aps_psum_stochastic]': (
        'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[int8_aps_ring]',
        'test_stochastic_rounding.py::test_train_step_reduces_with_the_key_of_each_step[jit-None]',
        'test_sharded_low_bit.py::test_sharded_step_equals_the_replicated_step_with_the_same_grad_sync[False]',
    ),
    'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[torus]': (
        'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[ring]',
        'test_grad_sync.py::test_deprecated_torus_shape_warns_and_is_grid',
        'test_grad_sync.py::test_builders_refuse_a_config_together_with_its_flat_keywords',
        'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[bounded_lars-torus-torus]',
    ),
    # test_parallel_collectives.py
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[4x2]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[3x2]',
    ),
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[8x1]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x3]',
    ),
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[3x1]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x3]',
    ),
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x8]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x3]',
    ),
    # test_tpu_compile.py
    'test_tpu_compile.py::test_step_options_compile_for_tpu[options1]': (
        'test_tpu_compile.py::test_step_options_compile_for_tpu[options0]',
        'test_tpu_compile.py::test_step_options_compile_for_tpu[options2]',
        'test_tpu_compile.py::test_sharded_low_bit_step_compiles_for_tpu',
        'test_tpu_compile.py::test_low_bit_payloads_travel_in_their_type[int4-s4]',
        'test_hierarchical_sync.py::test_error_feedback_matches_numpy_over_three_steps[int8-True]',
    ),
    'test_tpu_compile.py::test_steps_compile_for_tpu_slices[v3-8-replicated-lamb]': (
        'test_tpu_compile.py::test_steps_compile_for_tpu_slices[v2-8-replicated-lars]',
        'test_tpu_compile.py::test_step_options_compile_for_tpu[options0]',
    ),
    'test_tpu_compile.py::test_steps_compile_for_tpu_slices[v2-8-sharded-lamb]': (
        'test_tpu_compile.py::test_steps_compile_for_tpu_slices[v3-8-sharded-lars]',
        'test_tpu_compile.py::test_step_options_compile_for_tpu[options0]',
    ),
    # test_train_step_state.py
    'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit-lamb-1]': (
        'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit_shard_update-bounded_lars-4]',
        'test_train_step_state.py::test_typed_key_and_model_state_with_aux',
    ),
    'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[pmap-lamb-2]': (
        'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit_shard_update-bounded_lars-4]',
        'test_train_step_state.py::test_typed_key_and_model_state_with_aux',
        'test_train_step_state.py::test_bad_input_names_the_argument',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_pmap_train_step]',
    ),
    'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit-lars-2]': (
        'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit_shard_update-bounded_lars-4]',
        'test_train_step_state.py::test_microbatches_equal_one_big_batch[lars]',
    ),
    'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[bounded_lars-rules2-True]': (
        'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[lamb-rules1-False]',
        'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[lamb-rules3-True]',
        'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit_shard_update-bounded_lars-4]',
    ),
    'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[lars-rules0-False]': (
        'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[lamb-rules1-False]',
        'test_train_step_state.py::test_microbatches_equal_one_big_batch[lars]',
    ),
    # test_low_precision_blocks.py
    'test_low_precision_blocks.py::test_a_priori_bound_per_block[float4_e2m1fn-torus-None]': (
        'test_low_precision_blocks.py::test_a_priori_bound_per_block[float8_e4m3fn-ring-None]',
        'test_low_precision_blocks.py::test_ring_with_measured_scales_matches_the_reference[float4_e2m1fn-None]',
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
    ),
    'test_low_precision_blocks.py::test_a_priori_bound_per_block[int4-torus-8]': (
        'test_low_precision_blocks.py::test_a_priori_bound_per_block[int8-ring-32]',
        'test_low_precision_blocks.py::test_ring_with_measured_scales_matches_the_reference[float4_e2m1fn-None]',
        'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[bounded_lars-torus-torus]',
    ),
    'test_low_precision_blocks.py::test_reduce_scatter_for_a_sharded_update_matches_the_all_reduce[torus-kw5]': (
        'test_low_precision_blocks.py::test_reduce_scatter_for_a_sharded_update_matches_the_all_reduce[ring-kw1]',
        'test_low_precision_blocks.py::test_one_step_int8_gradient_within_2_percent_per_layer_with_block_scales',
        'test_readme.py::test_snippet_runs[docs/guide/low_precision_communication.md-0]',
        'test_error_feedback.py::test_two_stage_error_feedback_matches_numpy[psum-True]',
    ),
    'test_low_precision_blocks.py::test_aps_beside_block_scales_changes_nothing': (
        'test_low_precision_blocks.py::test_scales_travel_in_the_payload_messages_without_a_pmax[int8-wire0]',
        'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[bounded_lars-torus-torus]',
    ),
    # test_residual_restore.py
    'test_residual_restore.py::test_resume_on_another_replica_count[4-8]': (
        'test_residual_restore.py::test_resume_on_another_replica_count[8-4]',
    ),
    'test_residual_restore.py::test_a_state_without_residuals_starts_from_zeros[pmap-ring]': (
        'test_residual_restore.py::test_a_state_without_residuals_starts_from_zeros[jit-ring]',
        'test_residual_restore.py::test_a_state_without_residuals_starts_from_zeros[pmap-two_shot]',
    ),
    # test_grad_sync_scaling.py
    'test_grad_sync_scaling.py::test_step_with_measured_scales_flat_equals_config_and_matches_numpy[torus_measured-False]': (
        'test_grad_sync_scaling.py::test_step_with_measured_scales_flat_equals_config_and_matches_numpy[ring_block8-False]',
        'test_grad_sync_scaling.py::test_a_payload_alone_gets_blocks_of_32_over_hops_and_aps_over_psum',
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
    ),
    # test_grad_stats.py
    'test_grad_stats.py::test_statistics_agree_across_step_options[options4]': (
        'test_grad_stats.py::test_statistics_agree_across_step_options[options2]',
        'test_grad_stats.py::test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean[mesh]',
        'test_grad_stats.py::test_regrouping_replicas_and_microbatches_is_exact[1-8]',
        'test_error_feedback.py::test_constant_gradient_int4_ends_within_2_percent_of_float32[ring]',
    ),
    'test_grad_stats.py::test_statistics_agree_across_step_options[options5]': (
        'test_grad_stats.py::test_statistics_agree_across_step_options[options2]',
        'test_grad_stats.py::test_statistics_agree_across_step_options[options0]',
        'test_grad_stats.py::test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean[mesh]',
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
    ),
    'test_grad_stats.py::test_statistics_agree_across_step_options[options1]': (
        'test_grad_stats.py::test_statistics_agree_across_step_options[options0]',
        'test_grad_stats.py::test_regrouping_replicas_and_microbatches_is_exact[1-8]',
        'test_readme.py::test_snippet_runs[docs/guide/low_precision_communication.md-1]',
    ),
    'test_grad_stats.py::test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean[sharded]': (
        'test_grad_stats.py::test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean[mesh]',
        'test_grad_stats.py::test_statistics_on_the_sharded_mesh_cost_little_memory_traffic',
        'test_tpu_compile.py::test_sharded_low_bit_step_compiles_for_tpu',
        'test_sharded_low_bit.py::test_make_train_step_routes_the_payload_to_the_sharded_builder_and_refuses_misfits',
    ),
    'test_grad_stats.py::test_statistics_agree_across_step_options[options3]': (
        'test_grad_stats.py::test_statistics_agree_across_step_options[options2]',
        'test_grad_stats.py::test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean[mesh]',
    ),
    # test_transforms.py
    'test_transforms.py::test_multisteps_accumulates[bounded_lars_adam]': (
        'test_transforms.py::test_multisteps_accumulates[lars]',
        'test_transforms.py::test_multisteps_accumulates[lamb]',
        'test_transforms.py::test_converges_on_quadratic[bounded_lars_adam]',
    ),
    'test_transforms.py::test_state_sharding_type_stable[lars]': (
        'test_transforms.py::test_state_sharding_type_stable[lamb]',
        'test_transforms.py::test_state_sharding_type_stable[trust_ratio]',
        'test_transforms.py::test_fused_lars_equals_chain_of_primitives[0.05-sum_of_norms]',
    ),
    'test_transforms.py::test_state_sharding_type_stable[bounded_lars_adam]': (
        'test_transforms.py::test_state_sharding_type_stable[lamb]',
        'test_transforms.py::test_state_sharding_type_stable[trust_ratio]',
        'test_transforms.py::test_converges_on_quadratic[bounded_lars_adam]',
    ),
    'test_transforms.py::test_state_sharding_type_stable[bounded_lars_momentum]': (
        'test_transforms.py::test_state_sharding_type_stable[lamb]',
        'test_transforms.py::test_state_sharding_type_stable[trust_ratio]',
        'test_transforms.py::test_bounded_lars_matches_reference[update-nesterov]',
    ),
    'test_transforms.py::test_bf16_params_keep_dtype[bounded_lars_adam]': (
        'test_transforms.py::test_bf16_params_keep_dtype[lars]',
        'test_transforms.py::test_bf16_params_keep_dtype[trust_ratio]',
        'test_transforms.py::test_bf16_params_keep_dtype[lamb]',
        'test_transforms.py::test_converges_on_quadratic[bounded_lars_adam]',
    ),
    'test_transforms.py::test_bf16_params_keep_dtype[bounded_lars_momentum]': (
        'test_transforms.py::test_bf16_params_keep_dtype[lars]',
        'test_transforms.py::test_bf16_params_keep_dtype[trust_ratio]',
        'test_transforms.py::test_bf16_params_keep_dtype[lamb]',
        'test_transforms.py::test_bounded_lars_matches_reference[update-nesterov]',
    ),
    'test_transforms.py::test_no_retracing[bounded_lars_adam]': (
        'test_transforms.py::test_no_retracing[lars]',
        'test_transforms.py::test_no_retracing[trust_ratio]',
        'test_transforms.py::test_no_retracing[lamb]',
        'test_transforms.py::test_converges_on_quadratic[bounded_lars_adam]',
    ),
    'test_transforms.py::test_no_retracing[bounded_lars_momentum]': (
        'test_transforms.py::test_no_retracing[lars]',
        'test_transforms.py::test_no_retracing[trust_ratio]',
        'test_transforms.py::test_no_retracing[lamb]',
        'test_transforms.py::test_bounded_lars_matches_reference[update-nesterov]',
    ),
    'test_transforms.py::test_inject_hyperparams[lamb-kw1]': (
        'test_transforms.py::test_inject_hyperparams[lars-kw0]',
        'test_transforms.py::test_inject_hyperparams[bounded_lars-kw2]',
        'test_transforms.py::test_bf16_params_keep_dtype[lamb]',
    ),
    'test_transforms.py::test_converges_on_quadratic[bounded_lars_momentum]': (
        'test_transforms.py::test_converges_on_quadratic[bounded_lars_adam]',
    ),
    'test_transforms.py::test_jit_equals_eager[bounded_lars_adam]': (
        'test_transforms.py::test_jit_equals_eager[bounded_lars_momentum]',
        'test_transforms.py::test_bounded_lars_on_repeated_small_leaves_matches_reference[update]',
    ),
    'test_transforms.py::test_lamb_equals_optax[kw2]': (
        'test_transforms.py::test_lamb_equals_optax[kw1]',
        'test_transforms.py::test_lamb_equals_optax[kw0]',
        'test_transforms.py::test_fused_lars_equals_chain_of_primitives[0.0-sum_of_norms]',
        'test_transforms.py::test_lamb_on_repeated_small_leaves_matches_reference[False-False]',
        'test_optimizer_corners.py::test_lamb_with_a_mask_differs_from_optax_unless_trust_given',
    ),
    # test_engine.py
    'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[adam-0.002-options4]': (
        'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[adam-0.002-options3]',
        'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[momentum-0.05-options0]',
        'test_engine.py::test_baseline_solver_is_plain_momentum',
        'test_transforms.py::test_inject_hyperparams[bounded_lars-kw2]',
    ),
    'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[rmsprop-0.005-options5]': (
        'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[adam-0.002-options3]',
        'test_engine.py::test_date_optimizers_train_under_jit_at_large_batch[rmsprop-0.005]',
    ),
    'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[momentum-0.05-options1]': (
        'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[momentum-0.05-options0]',
        'test_engine.py::test_baseline_solver_is_plain_momentum',
        'test_transforms.py::test_inject_hyperparams[bounded_lars-kw2]',
    ),
    'test_engine.py::test_date_optimizers_train_under_jit_at_large_batch[nesterov-0.05]': (
        'test_engine.py::test_date_optimizers_train_under_jit_at_large_batch[momentum-0.05]',
    ),
    # test_sharded_low_bit.py
    'test_sharded_low_bit.py::test_low_bit_sharded_step_is_within_the_formats_bound_of_float32[sync2-127.0]': (
        'test_sharded_low_bit.py::test_low_bit_sharded_step_is_within_the_formats_bound_of_float32[sync0-127.0]',
        'test_sharded_low_bit.py::test_make_train_step_routes_the_payload_to_the_sharded_builder_and_refuses_misfits',
        'test_grad_sync.py::test_deprecated_torus_shape_warns_and_is_grid',
    ),
    'test_sharded_low_bit.py::test_sharded_step_equals_the_replicated_step_with_the_same_grad_sync[True]': (
        'test_sharded_low_bit.py::test_sharded_step_equals_the_replicated_step_with_the_same_grad_sync[False]',
        'test_sharded_low_bit.py::test_lamb_trust_ratios_of_a_model_sharded_layer_match_the_replicated_layout',
        'test_sharded_low_bit.py::test_error_feedback_on_the_sharded_step_matches_the_replicated_one_where_exact',
        'test_error_feedback.py::test_two_stage_error_feedback_matches_numpy[psum-True]',
    ),
    # test_parallel_steps.py
    'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[lars-data-psum]': (
        'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[lamb-torus-psum]',
        'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[bounded_lars-torus-torus]',
        'test_parallel_steps.py::test_shard_update_equals_unsharded[lars-data-psum-unsharded0]',
    ),
    'test_parallel_steps.py::test_shard_update_equals_unsharded[lamb-torus-torus-unsharded1]': (
        'test_parallel_steps.py::test_shard_update_equals_unsharded[lars-data-psum-unsharded0]',
        'test_parallel_steps.py::test_sharded_state_checkpoints_and_resumes_exactly',
    ),
    'test_parallel_steps.py::test_shard_update_equals_unsharded[bounded_lars-torus-ring-unsharded2]': (
        'test_parallel_steps.py::test_shard_update_equals_unsharded[lars-data-psum-unsharded0]',
        'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[bounded_lars-torus-torus]',
        'test_parallel_steps.py::test_step_reduces_gradients_exactly_once[ring]',
    ),
    # test_batch_norm.py
    'test_batch_norm.py::test_groups_match_reference[8-2-vmap]': (
        'test_batch_norm.py::test_groups_match_reference[8-2-pmap]',
    ),
    'test_batch_norm.py::test_groups_match_reference[None-None-vmap]': (
        'test_batch_norm.py::test_groups_match_reference[None-None-pmap]',
    ),
    'test_batch_norm.py::test_groups_match_reference[4-4-vmap]': (
        'test_batch_norm.py::test_groups_match_reference[2-2-shard_map]',
    ),
    'test_batch_norm.py::test_groups_match_reference[2-2-vmap]': (
        'test_batch_norm.py::test_groups_match_reference[2-2-shard_map]',
    ),
    'test_batch_norm.py::test_groups_match_reference[1-None-vmap]': (
        'test_batch_norm.py::test_groups_match_reference[1-None-pmap]',
    ),
    # test_batch_schedule.py
    'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[0]': (
        'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[3]',
    ),
    'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[4]': (
        'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[3]',
    ),
    'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[2]': (
        'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[3]',
    ),
    'test_batch_schedule.py::test_fixed_schedule_honours_the_scaling_rules[kw2]': (
        'test_batch_schedule.py::test_fixed_schedule_honours_the_scaling_rules[kw1]',
        'test_batch_schedule.py::test_a_run_longer_than_the_count_is_refused',
    ),
    'test_batch_schedule.py::test_adaptive_matches_reference[2]': (
        'test_batch_schedule.py::test_adaptive_matches_reference[4]',
    ),
    'test_batch_schedule.py::test_adaptive_matches_reference[5]': (
        'test_batch_schedule.py::test_adaptive_matches_reference[4]',
    ),
    'test_batch_schedule.py::test_resume_is_exact[ramp]': (
        'test_batch_schedule.py::test_resume_is_exact[adaptive]',
        'test_batch_schedule.py::test_growing_step_equals_fixed_step_at_each_size[1]',
    ),
    # test_low_precision.py
    'test_low_precision.py::test_aps_error_bound_per_layer[int8-torus]': (
        'test_low_precision.py::test_aps_error_bound_per_layer[int8-ring]',
        'test_low_precision.py::test_non_finite_gradient_arrives_as_nan[float4_e2m1fn-False]',
    ),
    'test_low_precision.py::test_aps_error_bound_per_layer[float8_e4m3fn-psum]': (
        'test_low_precision.py::test_aps_error_bound_per_layer[float8_e4m3fn-ring]',
        'test_sharded_low_bit.py::test_sharded_step_equals_the_replicated_step_with_the_same_grad_sync[False]',
    ),
    # test_error_feedback.py
    'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[psum-False]': (
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-False]',
        'test_error_feedback.py::test_two_stage_error_feedback_matches_numpy[psum-True]',
    ),
    'test_error_feedback.py::test_every_rounding_is_fed_back[torus-fp8-aps]': (
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
        'test_error_feedback.py::test_every_rounding_is_fed_back[ring-bf16]',
        'test_error_feedback.py::test_error_feedback_delivers_what_compression_dropped',
    ),
    # test_optimizer_corners.py
    'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[adam-options4]': (
        'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[momentum-options0]',
        'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[adagrad-options2]',
        'test_optimizer_corners.py::test_bounded_lars_complex_matches_reference[adam]',
    ),
    'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[nesterov-options1]': (
        'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[momentum-options0]',
    ),
    'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[rmsprop-options3]': (
        'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[momentum-options0]',
        'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[adagrad-options2]',
        'test_optimizer_corners.py::test_bounded_lars_rmsprop_initial_scale[0.0]',
    ),
    'test_optimizer_corners.py::test_update_dtype_is_promoted[bounded_lars]': (
        'test_optimizer_corners.py::test_update_dtype_is_promoted[lars]',
        'test_optimizer_corners.py::test_update_dtype_is_promoted[lamb]',
        'test_optimizer_corners.py::test_bounded_lars_complex_matches_reference[adam]',
    ),
    # test_two_shot.py
    'test_two_shot.py::test_nothing_is_lost_only_delayed[int4-bf16-residuals]': (
        'test_two_shot.py::test_nothing_is_lost_only_delayed[int4-blocks]',
    ),
    'test_two_shot.py::test_pmap_two_shot_equals_the_mesh_step_bit_for_bit': (
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
        'test_two_shot.py::test_nothing_is_lost_only_delayed[torus-int8-shift-stochastic]',
        'test_residual_restore.py::test_a_state_without_residuals_starts_from_zeros[pmap-two_shot]',
    ),
    # test_tpu_generations.py
    'test_tpu_generations.py::test_builders_run_over_slices_and_data_as_over_one_axis[sharded]': (
        'test_tpu_generations.py::test_builders_run_over_slices_and_data_as_over_one_axis[shard_update]',
        'test_grad_stats.py::test_statistics_on_the_sharded_mesh_cost_little_memory_traffic',
    ),
}
