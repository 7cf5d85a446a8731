# ruff: noqa: E501  (test node ids are as long as their parameters make them)
"""The tests that run in `make test-all` only, each with default tests that cover its path.

`make test` stays short on the two-core machines CI uses; `make test-all` runs
everything. A test is listed here only where the default suite executes every
line of the library (`date_optax/`, `examples/`, `benchmarks/`) that the test
executes (and, for those `propose` found, another test of its family, its
name before ``[``, stays in the default run): measured per test with
coverage.py over the default suite and these tests (`python -m
benchmarks.suite_coverage run`, then `check`; `propose` finds more, the
slowest first). Beside each test, the default tests whose
lines together contain its lines (the same family first). What the listed
test adds is its own values (another optimizer, format or layout through the
same code), which `make test-all` still checks.

`tests/conftest.py` marks each of these `slow`; a name here that the suite no
longer collects fails the collection.
"""

MOVED: dict[str, tuple[str, ...]] = {
    # test_sharded_transforms.py
    'test_sharded_transforms.py::test_sharded_equals_unsharded[trust_ratio-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_state_records.py::test_scale_by_trust_ratio_records_bounds_not_learning_rate',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[trust_ratio-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_state_records.py::test_scale_by_trust_ratio_records_bounds_not_learning_rate',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lamb-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_bert_lamb.py::test_bert_gain_optimizers_are_the_lamb_baseline_at_b0_and_scale_by_the_gain',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lamb-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_bert_lamb.py::test_bert_gain_optimizers_are_the_lamb_baseline_at_b0_and_scale_by_the_gain',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[date-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_demo.py::test_demo_end_to_end_small',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[bounded_lars-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_transforms.py::test_bounded_lars_on_repeated_small_leaves_matches_reference[gradient]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[bounded_lars-explicit-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_transforms.py::test_bounded_lars_on_repeated_small_leaves_matches_reference[gradient]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lars-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_examples.py::test_resnet_fake_data_smoke',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lars-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_examples.py::test_resnet_fake_data_smoke',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[bounded_lars-explicit-eager]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_transforms.py::test_bounded_lars_on_repeated_small_leaves_matches_reference[gradient]',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[trust_ratio-explicit-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_state_records.py::test_scale_by_trust_ratio_records_bounds_not_learning_rate',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[date-auto-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_demo.py::test_demo_end_to_end_small',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lamb-explicit-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_bert_lamb.py::test_bert_gain_optimizers_are_the_lamb_baseline_at_b0_and_scale_by_the_gain',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[date-explicit-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_demo.py::test_demo_end_to_end_small',
    ),
    'test_sharded_transforms.py::test_sharded_equals_unsharded[lars-explicit-jit]': (
        'test_sharded_transforms.py::test_sharded_equals_unsharded[lars_norm_of_sum-explicit-jit]',
        'test_examples.py::test_resnet_fake_data_smoke',
    ),
    # test_update_structure.py
    'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[lamb]': (
        'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[lars]',
        'test_update_structure.py::test_lamb_holds_one_large_layers_direction_at_a_time',
    ),
    'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[bounded_lars]': (
        'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[lars]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(momentum)]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(adam)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(rmsprop)]',
        'test_cli_plan.py::test_a_candidate_that_fails_to_compile_does_not_hide_the_others',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(adagrad)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(rmsprop)]',
        'test_transforms.py::test_bounded_lars_matches_reference[gradient-adagrad]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(momentum)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lamb]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars(nesterov,masks,bounds)]',
        'test_update_structure.py::test_lamb_holds_one_large_layers_direction_at_a_time',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio(adam)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars(nesterov,masks,bounds)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(momentum)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lamb]',
        'test_update_structure.py::test_lamb_holds_one_large_layers_direction_at_a_time',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio(adam,gradient)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lamb]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(momentum)]',
        'test_update_structure.py::test_large_layer_step_writes_no_parameter_sized_temporary[scale_by_trust_ratio(norm_of_sum)]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lamb(nvlamb,decoupled)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lamb]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars(nesterov,masks,bounds)]',
        'test_transforms.py::test_lamb_matches_reference[nvlamb]',
        'test_optimizer_corners.py::test_lamb_decoupled_weight_decay_matches_reference[False]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars(norm_of_sum)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lamb]',
        'test_update_structure.py::test_kernel_count_test_sees_per_leaf_reductions',
    ),
    'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[date(adam)]': (
        'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[lars]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[date(momentum)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(rmsprop)]',
        'test_cli_plan.py::test_a_candidate_that_fails_to_compile_does_not_hide_the_others',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio(bounds,wd)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars(nesterov,masks,bounds)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lamb]',
        'test_update_structure.py::test_lamb_holds_one_large_layers_direction_at_a_time',
    ),
    'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[date(momentum)]': (
        'test_update_structure.py::test_kernel_count_per_leaf_is_the_base_optimizers[lars]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[date(momentum)]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[scale_by_trust_ratio(norm_of_sum)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lamb]',
        'test_update_structure.py::test_large_layer_step_writes_no_parameter_sized_temporary[scale_by_trust_ratio(norm_of_sum)]',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[date(adam)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[date(momentum)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(rmsprop)]',
        'test_cli_plan.py::test_a_candidate_that_fails_to_compile_does_not_hide_the_others',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(adam,update)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[date(momentum)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(rmsprop)]',
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[lars(nesterov,masks,bounds)]',
        'test_cli_plan.py::test_a_candidate_that_fails_to_compile_does_not_hide_the_others',
    ),
    'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(sgd)]': (
        'test_update_structure.py::test_update_has_no_control_flow_and_no_dot[bounded_lars(momentum)]',
        'test_api_docs.py::test_doctest[date_optax.bounded_lars]',
    ),
    # test_collective_rounds.py
    'test_collective_rounds.py::test_stochastic_torus_draws_the_ranks_of_the_unrolled_rounds[2x4-plain]': (
        'test_collective_rounds.py::test_stochastic_torus_draws_the_ranks_of_the_unrolled_rounds[1x8-plain]',
        'test_collective_rounds.py::test_gather_of_a_replicated_chunk_under_checked_types[torus]',
    ),
    'test_collective_rounds.py::test_stochastic_torus_draws_the_ranks_of_the_unrolled_rounds[2x4-scaled]': (
        'test_collective_rounds.py::test_stochastic_torus_draws_the_ranks_of_the_unrolled_rounds[1x8-plain]',
        'test_collective_rounds.py::test_gather_of_a_replicated_chunk_under_checked_types[torus]',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_train_step]',
    ),
    'test_collective_rounds.py::test_tpu_program_does_not_grow_from_16_to_64_devices[torus]': (
        'test_collective_rounds.py::test_tpu_program_does_not_grow_from_16_to_64_devices[ring]',
        'test_collective_rounds.py::test_stochastic_torus_draws_the_ranks_of_the_unrolled_rounds[1x8-plain]',
        'test_collective_rounds.py::test_gather_of_a_replicated_chunk_under_checked_types[torus]',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_pmap_train_step]',
    ),
    'test_collective_rounds.py::test_ring_program_does_not_grow_from_4_to_8_devices[int8]': (
        'test_collective_rounds.py::test_ring_program_does_not_grow_from_4_to_8_devices[None]',
        'test_collective_rounds.py::test_stochastic_torus_draws_the_ranks_of_the_unrolled_rounds[1x8-plain]',
        'test_collective_rounds.py::test_gather_of_a_replicated_chunk_under_checked_types[torus]',
        'test_api_docs.py::test_doctest[date_optax.parallel.all_reduce]',
    ),
    # test_grad_sync.py
    'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[int8-torus]': (
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-psum]',
        'test_grad_sync.py::test_shard_update_and_pmap_reduce_through_the_one_function',
        'test_grad_sync.py::test_deprecated_torus_shape_warns_and_is_grid',
    ),
    'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[int8-psum]': (
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-psum]',
        'test_grad_sync.py::test_shard_update_and_pmap_reduce_through_the_one_function',
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
        'test_error_feedback.py::test_error_feedback_changes_nothing_when_the_payload_is_exact',
        'test_sharded_low_bit.py::test_lamb_trust_ratios_of_a_model_sharded_layer_match_the_replicated_layout',
    ),
    'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-ring]': (
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-psum]',
        'test_grad_sync.py::test_deprecated_torus_shape_warns_and_is_grid',
        'test_grad_sync.py::test_shard_update_and_pmap_reduce_through_the_one_function',
        'test_api_docs.py::test_doctest[date_optax.parallel.all_reduce]',
    ),
    'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[int8_aps_psum_stochastic]': (
        'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[psum]',
        'test_grad_sync.py::test_shard_update_and_pmap_reduce_through_the_one_function',
        'test_stochastic_rounding.py::test_stochastic_all_reduce_is_unbiased_where_nearest_is_not[int4-ring]',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_pmap_train_step]',
        'test_error_feedback.py::test_error_feedback_changes_nothing_when_the_payload_is_exact',
    ),
    'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[torus]': (
        'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[psum]',
        'test_grad_sync.py::test_deprecated_torus_shape_warns_and_is_grid',
        'test_grad_sync.py::test_shard_update_and_pmap_reduce_through_the_one_function',
        'test_grad_sync.py::test_a_torus_that_does_not_fit_the_replicas_is_refused_naming_its_layout',
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
    ),
    'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-torus]': (
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-psum]',
        'test_grad_sync.py::test_deprecated_torus_shape_warns_and_is_grid',
    ),
    'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[int8-ring]': (
        'test_grad_sync.py::test_sync_gradients_mean_and_reduce_scatter_against_numpy[None-psum]',
        'test_grad_sync.py::test_shard_update_and_pmap_reduce_through_the_one_function',
    ),
    'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[int8_aps_ring]': (
        'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[psum]',
        'test_grad_sync.py::test_shard_update_and_pmap_reduce_through_the_one_function',
        'test_grad_sync.py::test_deprecated_torus_shape_warns_and_is_grid',
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
    ),
    'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[ring]': (
        'test_grad_sync.py::test_grad_sync_step_equals_flat_keyword_step_bit_for_bit[psum]',
        'test_grad_sync.py::test_deprecated_torus_shape_warns_and_is_grid',
        'test_grad_sync.py::test_shard_update_and_pmap_reduce_through_the_one_function',
        'test_api_docs.py::test_doctest[date_optax.parallel.all_reduce]',
    ),
    # test_parallel_collectives.py
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[4x2]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x1]',
        'test_parallel_collectives.py::test_float32_random_values_match_psum_closely',
    ),
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[8x1]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x1]',
        'test_parallel_collectives.py::test_float32_random_values_match_psum_closely',
    ),
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[3x1]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x1]',
        'test_parallel_collectives.py::test_float32_random_values_match_psum_closely',
    ),
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x8]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x1]',
        'test_parallel_collectives.py::test_float32_random_values_match_psum_closely',
    ),
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[2x4]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x1]',
        'test_parallel_collectives.py::test_float32_random_values_match_psum_closely',
    ),
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[3x2]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x1]',
        'test_parallel_collectives.py::test_float32_random_values_match_psum_closely',
    ),
    'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x3]': (
        'test_parallel_collectives.py::test_ring_and_torus_equal_psum_on_torus_meshes[1x1]',
        'test_parallel_collectives.py::test_float32_random_values_match_psum_closely',
    ),
    'test_parallel_collectives.py::test_torus_halves_share_rounds_in_the_compiled_program[2x4]': (
        'test_parallel_collectives.py::test_torus_halves_share_rounds_in_the_compiled_program[1x8]',
        'test_parallel_collectives.py::test_check_vma_true_is_supported',
    ),
    'test_parallel_collectives.py::test_reduce_scatter_layout_matches_partition_spec[4x2]': (
        'test_parallel_collectives.py::test_reduce_scatter_layout_matches_partition_spec[2x4]',
    ),
    'test_parallel_collectives.py::test_torus_halves_share_rounds_in_the_compiled_program[8x1]': (
        'test_parallel_collectives.py::test_torus_halves_share_rounds_in_the_compiled_program[1x8]',
    ),
    'test_parallel_collectives.py::test_torus_halves_share_rounds_in_the_compiled_program[4x2]': (
        'test_parallel_collectives.py::test_torus_halves_share_rounds_in_the_compiled_program[1x8]',
        'test_parallel_collectives.py::test_check_vma_true_is_supported',
    ),
    # test_tpu_compile.py
    'test_tpu_compile.py::test_step_options_compile_for_tpu[options1]': (
        'test_tpu_compile.py::test_step_options_compile_for_tpu[options0]',
        'test_tpu_compile.py::test_sharded_low_bit_step_compiles_for_tpu',
        'test_tpu_compile.py::test_rounds_are_read_from_async_tpu_collective_permutes',
        'test_tpu_compile.py::test_low_bit_payloads_travel_in_their_type[int8-s8]',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_train_step]',
    ),
    'test_tpu_compile.py::test_steps_compile_for_tpu_slices[v3-8-replicated-lamb]': (
        'test_tpu_compile.py::test_steps_compile_for_tpu_slices[v3-8-sharded-lars]',
        'test_tpu_compile.py::test_step_options_compile_for_tpu[options0]',
        'test_tpu_compile.py::test_a_program_that_does_not_fit_says_by_how_much',
    ),
    'test_tpu_compile.py::test_steps_compile_for_tpu_slices[v2-8-sharded-lamb]': (
        'test_tpu_compile.py::test_steps_compile_for_tpu_slices[v3-8-sharded-lars]',
        'test_tpu_compile.py::test_sharded_low_bit_step_compiles_for_tpu',
        'test_tpu_compile.py::test_rounds_are_read_from_async_tpu_collective_permutes',
    ),
    'test_tpu_compile.py::test_low_bit_payloads_travel_in_their_type[int4-s4]': (
        'test_tpu_compile.py::test_low_bit_payloads_travel_in_their_type[int8-s8]',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_sharded_train_step]',
    ),
    'test_tpu_compile.py::test_step_options_compile_for_tpu[options2]': (
        'test_tpu_compile.py::test_step_options_compile_for_tpu[options0]',
        'test_tpu_compile.py::test_torus_all_reduce_is_collective_permutes_along_the_two_axes',
        'test_parallel_steps.py::test_shard_update_equals_unsharded[lars-data-psum-unsharded0]',
    ),
    'test_tpu_compile.py::test_steps_compile_for_tpu_slices[v2-8-replicated-lars]': (
        'test_tpu_compile.py::test_steps_compile_for_tpu_slices[v3-8-sharded-lars]',
        'test_tpu_compile.py::test_a_program_that_does_not_fit_says_by_how_much',
    ),
    # test_train_step_state.py
    'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit-lamb-1]': (
        'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit_shard_update-bounded_lars-4]',
        'test_train_step_state.py::test_typed_key_and_model_state_with_aux',
    ),
    'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[pmap-lamb-2]': (
        'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit_shard_update-bounded_lars-4]',
        'test_train_step_state.py::test_param_sharding_as_a_spec_tree',
        'test_train_step_state.py::test_bad_input_names_the_argument',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_pmap_train_step]',
    ),
    'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit-lars-2]': (
        'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit_shard_update-bounded_lars-4]',
        'test_train_step_state.py::test_microbatches_equal_one_big_batch[lars]',
    ),
    'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[bounded_lars-rules2-True]': (
        'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[lamb-rules3-True]',
        'test_train_step_state.py::test_model_state_and_keys_match_single_device_reference[jit_shard_update-bounded_lars-4]',
        'test_train_step_state.py::test_a_returned_state_and_a_placed_batch_skip_the_host_checks',
    ),
    'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[lars-rules0-False]': (
        'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[lamb-rules3-True]',
        'test_train_step_state.py::test_microbatches_equal_one_big_batch[lars]',
        'test_train_step_state.py::test_param_sharding_as_a_spec_tree',
    ),
    'test_train_step_state.py::test_microbatches_equal_one_big_batch[lamb]': (
        'test_train_step_state.py::test_microbatches_equal_one_big_batch[lars]',
        'test_train_step_state.py::test_param_sharding_as_a_spec_tree',
    ),
    'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[lamb-rules1-False]': (
        'test_train_step_state.py::test_sharded_params_equal_data_parallel_and_one_device[lamb-rules3-True]',
        'test_train_step_state.py::test_a_returned_state_and_a_placed_batch_skip_the_host_checks',
        'test_train_step_state.py::test_param_sharding_as_a_spec_tree',
    ),
    'test_train_step_state.py::test_the_skip_adds_no_pass_over_parameters_or_optimizer_state[lars]': (
        'test_train_step_state.py::test_the_skip_adds_no_pass_over_parameters_or_optimizer_state[lars_norm_of_sum]',
        'test_train_step_state.py::test_the_skip_adds_no_pass_over_parameters_or_optimizer_state[lamb]',
    ),
    # test_low_precision_blocks.py
    'test_low_precision_blocks.py::test_a_priori_bound_per_block[float4_e2m1fn-torus-None]': (
        'test_low_precision_blocks.py::test_a_priori_bound_per_block[int8-ring-32]',
        'test_low_precision_blocks.py::test_non_finite_value_poisons_its_group_only',
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
        'test_low_precision.py::test_nan_gradient_skips_the_step_with_a_low_precision_payload',
    ),
    'test_low_precision_blocks.py::test_a_priori_bound_per_block[int4-torus-8]': (
        'test_low_precision_blocks.py::test_a_priori_bound_per_block[int8-ring-32]',
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
    ),
    'test_low_precision_blocks.py::test_reduce_scatter_for_a_sharded_update_matches_the_all_reduce[torus-kw5]': (
        'test_low_precision_blocks.py::test_reduce_scatter_for_a_sharded_update_matches_the_all_reduce[ring-kw0]',
        'test_low_precision_blocks.py::test_one_step_int8_gradient_within_2_percent_per_layer_with_block_scales',
        'test_readme.py::test_snippet_runs[docs/guide/low_precision_communication.md-0]',
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
    ),
    'test_low_precision_blocks.py::test_aps_beside_block_scales_changes_nothing': (
        'test_low_precision_blocks.py::test_measured_bound_gains_from_cancellation[int8-8]',
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
    ),
    'test_low_precision_blocks.py::test_train_step_with_block_scales_through_grad_sync[jit]': (
        'test_low_precision_blocks.py::test_train_step_with_block_scales_through_grad_sync[shard_update]',
        'test_api_docs.py::test_doctest[date_optax.parallel.CompileReport]',
    ),
    'test_low_precision_blocks.py::test_reduce_scatter_for_a_sharded_update_matches_the_all_reduce[ring-kw1]': (
        'test_low_precision_blocks.py::test_reduce_scatter_for_a_sharded_update_matches_the_all_reduce[ring-kw0]',
        'test_low_precision_blocks.py::test_non_finite_value_poisons_its_group_only',
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
    ),
    'test_low_precision_blocks.py::test_ring_with_measured_scales_matches_the_reference[float4_e2m1fn-None]': (
        'test_low_precision_blocks.py::test_ring_with_measured_scales_matches_the_reference[int8-8]',
        'test_low_precision_blocks.py::test_non_finite_value_poisons_its_group_only',
        'test_low_precision.py::test_nan_gradient_skips_the_step_with_a_low_precision_payload',
    ),
    'test_low_precision_blocks.py::test_measured_bound_gains_from_cancellation[int4-None]': (
        'test_low_precision_blocks.py::test_measured_bound_gains_from_cancellation[int8-8]',
        'test_low_precision_blocks.py::test_non_finite_value_poisons_its_group_only',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_sharded_train_step]',
    ),
    'test_low_precision_blocks.py::test_a_priori_bound_per_block[float8_e4m3fn-ring-None]': (
        'test_low_precision_blocks.py::test_a_priori_bound_per_block[int8-ring-32]',
        'test_low_precision_blocks.py::test_non_finite_value_poisons_its_group_only',
        'test_low_precision.py::test_nan_gradient_skips_the_step_with_a_low_precision_payload',
    ),
    # test_residual_restore.py
    'test_residual_restore.py::test_resume_on_another_replica_count[4-8]': (
        'test_residual_restore.py::test_resume_on_another_replica_count[8-4]',
        'test_residual_restore.py::test_checkpoint_bytes_do_not_grow_with_replicas_per_device',
    ),
    'test_residual_restore.py::test_a_state_without_residuals_starts_from_zeros[pmap-ring]': (
        'test_residual_restore.py::test_a_state_without_residuals_starts_from_zeros[pmap-two_shot]',
        'test_residual_restore.py::test_residuals_left_out_and_unread',
    ),
    'test_residual_restore.py::test_a_state_without_residuals_starts_from_zeros[jit-ring]': (
        'test_residual_restore.py::test_a_state_without_residuals_starts_from_zeros[jit-two_shot]',
        'test_residual_restore.py::test_residuals_left_out_and_unread',
    ),
    # test_grad_sync_scaling.py
    'test_grad_sync_scaling.py::test_step_with_measured_scales_flat_equals_config_and_matches_numpy[torus_measured-False]': (
        'test_grad_sync_scaling.py::test_step_with_measured_scales_flat_equals_config_and_matches_numpy[ring_block8-False]',
        'test_grad_sync_scaling.py::test_a_payload_alone_gets_blocks_of_32_over_hops_and_aps_over_psum',
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
    ),
    'test_grad_sync_scaling.py::test_step_with_measured_scales_flat_equals_config_and_matches_numpy[ring_block8-True]': (
        'test_grad_sync_scaling.py::test_step_with_measured_scales_flat_equals_config_and_matches_numpy[ring_block8-False]',
        'test_grad_sync_scaling.py::test_block_scales_beat_aps_on_a_layer_of_mixed_scales',
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
    ),
    # test_grad_stats.py
    'test_grad_stats.py::test_statistics_agree_across_step_options[options4]': (
        'test_grad_stats.py::test_statistics_agree_across_step_options[options2]',
        'test_grad_stats.py::test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean[mesh]',
        'test_grad_stats.py::test_one_unit_is_refused_and_options_checked',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_sharded_train_step]',
    ),
    'test_grad_stats.py::test_statistics_agree_across_step_options[options5]': (
        'test_grad_stats.py::test_statistics_agree_across_step_options[options2]',
        'test_grad_stats.py::test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean[mesh]',
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
    ),
    'test_grad_stats.py::test_statistics_agree_across_step_options[options1]': (
        'test_grad_stats.py::test_statistics_agree_across_step_options[options2]',
        'test_grad_stats.py::test_one_unit_is_refused_and_options_checked',
        'test_api_docs.py::test_doctest[date_optax.parallel.all_reduce]',
    ),
    'test_grad_stats.py::test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean[sharded]': (
        'test_grad_stats.py::test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean[mesh]',
        'test_grad_stats.py::test_statistics_on_the_sharded_mesh_cost_little_memory_traffic',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_sharded_train_step]',
        'test_sharded_low_bit.py::test_make_train_step_routes_the_payload_to_the_sharded_builder_and_refuses_misfits',
    ),
    'test_grad_stats.py::test_statistics_agree_across_step_options[options3]': (
        'test_grad_stats.py::test_statistics_agree_across_step_options[options2]',
        'test_grad_stats.py::test_statistics_under_a_low_bit_sync_read_the_uncompressed_mean[mesh]',
    ),
    'test_grad_stats.py::test_statistics_agree_across_step_options[options0]': (
        'test_grad_stats.py::test_statistics_agree_across_step_options[options2]',
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
    ),
    'test_grad_stats.py::test_regrouping_replicas_and_microbatches_is_exact[1-8]': (
        'test_grad_stats.py::test_regrouping_replicas_and_microbatches_is_exact[4-2]',
        'test_grad_stats.py::test_one_unit_is_refused_and_options_checked',
    ),
    'test_grad_stats.py::test_regrouping_replicas_and_microbatches_is_exact[2-4]': (
        'test_grad_stats.py::test_regrouping_replicas_and_microbatches_is_exact[4-2]',
    ),
    'test_grad_stats.py::test_adascale_matches_fairscale_reference[4.0]': (
        'test_grad_stats.py::test_adascale_matches_fairscale_reference[2.0]',
    ),
    'test_grad_stats.py::test_date_gain_at_scale_one_is_the_baseline_step_by_step[adam]': (
        'test_grad_stats.py::test_date_gain_at_scale_one_is_the_baseline_step_by_step[momentum]',
        'test_grad_stats.py::test_date_gain_multiplies_the_recipe_by_the_gain[adam-0.5]',
    ),
    # test_transforms.py
    'test_transforms.py::test_multisteps_accumulates[bounded_lars_adam]': (
        'test_transforms.py::test_multisteps_accumulates[lamb]',
        'test_transforms.py::test_bounded_lars_custom_base_transformation',
    ),
    'test_transforms.py::test_state_sharding_type_stable[lars]': (
        'test_transforms.py::test_state_sharding_type_stable[trust_ratio]',
        'test_transforms.py::test_jit_equals_eager[lars]',
    ),
    'test_transforms.py::test_state_sharding_type_stable[bounded_lars_adam]': (
        'test_transforms.py::test_state_sharding_type_stable[trust_ratio]',
        'test_transforms.py::test_bounded_lars_custom_base_transformation',
    ),
    'test_transforms.py::test_state_sharding_type_stable[bounded_lars_momentum]': (
        'test_transforms.py::test_state_sharding_type_stable[trust_ratio]',
        'test_transforms.py::test_bounded_lars_matches_reference[gradient-momentum]',
    ),
    'test_transforms.py::test_bf16_params_keep_dtype[bounded_lars_adam]': (
        'test_transforms.py::test_bf16_params_keep_dtype[trust_ratio]',
        'test_transforms.py::test_bounded_lars_custom_base_transformation',
    ),
    'test_transforms.py::test_bf16_params_keep_dtype[bounded_lars_momentum]': (
        'test_transforms.py::test_bf16_params_keep_dtype[trust_ratio]',
        'test_transforms.py::test_bounded_lars_matches_reference[gradient-momentum]',
    ),
    'test_transforms.py::test_no_retracing[bounded_lars_adam]': (
        'test_transforms.py::test_no_retracing[lars]',
        'test_transforms.py::test_no_retracing[trust_ratio]',
        'test_transforms.py::test_bounded_lars_custom_base_transformation',
    ),
    'test_transforms.py::test_no_retracing[bounded_lars_momentum]': (
        'test_transforms.py::test_no_retracing[lars]',
        'test_transforms.py::test_no_retracing[trust_ratio]',
        'test_transforms.py::test_bounded_lars_matches_reference[gradient-momentum]',
    ),
    'test_transforms.py::test_inject_hyperparams[lamb-kw1]': (
        'test_transforms.py::test_inject_hyperparams[bounded_lars-kw2]',
        'test_transforms.py::test_jit_equals_eager[lamb]',
    ),
    'test_transforms.py::test_converges_on_quadratic[bounded_lars_momentum]': (
        'test_transforms.py::test_converges_on_quadratic[bounded_lars_adam]',
    ),
    'test_transforms.py::test_jit_equals_eager[bounded_lars_adam]': (
        'test_transforms.py::test_jit_equals_eager[bounded_lars_momentum]',
        'test_transforms.py::test_bounded_lars_custom_base_transformation',
    ),
    'test_transforms.py::test_lamb_equals_optax[kw2]': (
        'test_transforms.py::test_lamb_equals_optax[kw0]',
        'test_transforms.py::test_lamb_trust_mask_defaults_to_weight_decay_mask',
        'test_transforms.py::test_lamb_on_repeated_small_leaves_matches_reference[True-False]',
        'test_names.py::test_new_names_do_not_warn',
    ),
    'test_transforms.py::test_lars_on_repeated_small_leaves_matches_reference[sum_of_norms]': (
        'test_transforms.py::test_lars_on_repeated_small_leaves_matches_reference[norm_of_sum]',
        'test_transforms.py::test_grouped_scalars_and_empty_leaves_keep_their_own_ratios',
    ),
    'test_transforms.py::test_multisteps_accumulates[lars]': (
        'test_transforms.py::test_multisteps_accumulates[lamb]',
        'test_transforms.py::test_jit_equals_eager[lars]',
    ),
    'test_transforms.py::test_optimizers_train_nnx_model_with_mask[lamb]': (
        'test_transforms.py::test_optimizers_train_nnx_model_with_mask[bounded]',
        'test_transforms.py::test_jit_equals_eager[lamb]',
    ),
    'test_transforms.py::test_inject_hyperparams[lars-kw0]': (
        'test_transforms.py::test_inject_hyperparams[bounded_lars-kw2]',
        'test_transforms.py::test_jit_equals_eager[lars]',
    ),
    'test_transforms.py::test_optimizers_train_nnx_model_with_mask[lars]': (
        'test_transforms.py::test_optimizers_train_nnx_model_with_mask[bounded]',
        'test_transforms.py::test_lars_skip_list_semantics',
    ),
    'test_transforms.py::test_lamb_equals_optax[kw1]': (
        'test_transforms.py::test_lamb_equals_optax[kw0]',
        'test_transforms.py::test_fused_lamb_equals_chain_of_primitives',
    ),
    'test_transforms.py::test_bf16_params_keep_dtype[lamb]': (
        'test_transforms.py::test_bf16_params_keep_dtype[trust_ratio]',
        'test_transforms.py::test_jit_equals_eager[lamb]',
    ),
    'test_transforms.py::test_bounded_lars_on_repeated_small_leaves_matches_reference[update]': (
        'test_transforms.py::test_bounded_lars_on_repeated_small_leaves_matches_reference[gradient]',
    ),
    'test_transforms.py::test_state_sharding_type_stable[lamb]': (
        'test_transforms.py::test_state_sharding_type_stable[trust_ratio]',
        'test_transforms.py::test_jit_equals_eager[lamb]',
    ),
    'test_transforms.py::test_lamb_on_repeated_small_leaves_matches_reference[False-False]': (
        'test_transforms.py::test_lamb_on_repeated_small_leaves_matches_reference[True-False]',
        'test_transforms.py::test_lars_on_repeated_small_leaves_matches_reference[norm_of_sum]',
    ),
    'test_transforms.py::test_lars_equals_optax_without_weight_decay[kw1]': (
        'test_transforms.py::test_lars_equals_optax_without_weight_decay[kw0]',
    ),
    'test_transforms.py::test_lars_equals_optax_without_weight_decay[kw2]': (
        'test_transforms.py::test_lars_equals_optax_without_weight_decay[kw0]',
    ),
    'test_transforms.py::test_fused_lars_equals_chain_of_primitives[0.05-sum_of_norms]': (
        'test_transforms.py::test_fused_lars_equals_chain_of_primitives[0.0-sum_of_norms]',
        'test_transforms.py::test_grouped_scalars_and_empty_leaves_keep_their_own_ratios',
    ),
    'test_transforms.py::test_lamb_on_repeated_small_leaves_matches_reference[False-True]': (
        'test_transforms.py::test_lamb_on_repeated_small_leaves_matches_reference[True-False]',
        'test_transforms.py::test_lars_on_repeated_small_leaves_matches_reference[norm_of_sum]',
        'test_transforms.py::test_lamb_matches_reference[nvlamb]',
    ),
    'test_transforms.py::test_lars_equals_optax_without_weight_decay[kw3]': (
        'test_transforms.py::test_lars_equals_optax_without_weight_decay[kw0]',
        'test_transforms.py::test_fused_lars_equals_chain_of_primitives[0.0-sum_of_norms]',
    ),
    'test_transforms.py::test_converges_on_quadratic[lars]': (
        'test_transforms.py::test_converges_on_quadratic[bounded_lars_adam]',
        'test_transforms.py::test_converges_on_quadratic[trust_ratio]',
        'test_transforms.py::test_empty_tree[lars]',
    ),
    'test_transforms.py::test_no_retracing[lamb]': (
        'test_transforms.py::test_no_retracing[lars]',
        'test_transforms.py::test_no_retracing[trust_ratio]',
        'test_transforms.py::test_fused_lamb_equals_chain_of_primitives',
    ),
    'test_transforms.py::test_fused_lars_equals_chain_of_primitives[0.05-norm_of_sum]': (
        'test_transforms.py::test_fused_lars_equals_chain_of_primitives[0.0-sum_of_norms]',
        'test_transforms.py::test_lars_matches_reference[norm_of_sum-False-0.01]',
    ),
    'test_transforms.py::test_bf16_params_keep_dtype[lars]': (
        'test_transforms.py::test_bf16_params_keep_dtype[trust_ratio]',
        'test_transforms.py::test_jit_equals_eager[lars]',
    ),
    'test_transforms.py::test_converges_on_quadratic[lamb]': (
        'test_transforms.py::test_converges_on_quadratic[bounded_lars_adam]',
        'test_transforms.py::test_jit_equals_eager[lamb]',
    ),
    # test_engine.py
    'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[adam-0.002-options4]': (
        'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[sgd-0.1-options2]',
        'test_engine.py::test_lamb_bert_table_with_warmup_ratio[0]',
        'test_engine.py::test_baseline_solver_is_plain_momentum',
        'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[bounded_lars momentum]',
    ),
    'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[rmsprop-0.005-options5]': (
        'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[sgd-0.1-options2]',
        'test_engine.py::test_lamb_bert_table_with_warmup_ratio[0]',
        'test_api_docs.py::test_doctest[date_optax.bounded_lars]',
    ),
    'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[momentum-0.05-options1]': (
        'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[sgd-0.1-options2]',
        'test_engine.py::test_baseline_solver_is_plain_momentum',
        'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[bounded_lars momentum]',
    ),
    'test_engine.py::test_date_optimizers_train_under_jit_at_large_batch[nesterov-0.05]': (
        'test_engine.py::test_date_optimizers_train_under_jit_at_large_batch[momentum-0.05]',
    ),
    'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[momentum-0.05-options0]': (
        'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[sgd-0.1-options2]',
        'test_engine.py::test_baseline_and_recipe_are_frozen_and_hashable',
    ),
    'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[adam-0.002-options3]': (
        'test_engine.py::test_date_at_b0_is_the_baseline_solver_step_by_step[sgd-0.1-options2]',
        'test_engine.py::test_lamb_bert_table_with_warmup_ratio[0]',
    ),
    'test_engine.py::test_date_optimizers_train_under_jit_at_large_batch[adam-0.002]': (
        'test_engine.py::test_date_optimizers_train_under_jit_at_large_batch[momentum-0.05]',
        'test_engine.py::test_lamb_bert_table_with_warmup_ratio[0]',
    ),
    'test_engine.py::test_date_optimizers_train_under_jit_at_large_batch[rmsprop-0.005]': (
        'test_engine.py::test_date_optimizers_train_under_jit_at_large_batch[momentum-0.05]',
        'test_engine.py::test_lamb_bert_table_with_warmup_ratio[0]',
        'test_api_docs.py::test_doctest[date_optax.bounded_lars]',
    ),
    # test_sharded_low_bit.py
    'test_sharded_low_bit.py::test_low_bit_sharded_step_is_within_the_formats_bound_of_float32[sync2-127.0]': (
        'test_sharded_low_bit.py::test_low_bit_sharded_step_is_within_the_formats_bound_of_float32[sync1-7.0]',
        'test_sharded_low_bit.py::test_sharded_step_equals_the_replicated_step_with_the_same_grad_sync[False]',
        'test_sharded_low_bit.py::test_make_train_step_routes_the_payload_to_the_sharded_builder_and_refuses_misfits',
        'test_api_docs.py::test_doctest[date_optax.parallel.make_pmap_train_step]',
    ),
    'test_sharded_low_bit.py::test_sharded_step_equals_the_replicated_step_with_the_same_grad_sync[True]': (
        'test_sharded_low_bit.py::test_sharded_step_equals_the_replicated_step_with_the_same_grad_sync[False]',
        'test_sharded_low_bit.py::test_lamb_trust_ratios_of_a_model_sharded_layer_match_the_replicated_layout',
        'test_hierarchical_sync.py::test_ring_across_slices_loses_nothing_with_sharded_updates',
    ),
    'test_sharded_low_bit.py::test_low_bit_sharded_step_is_within_the_formats_bound_of_float32[sync0-127.0]': (
        'test_sharded_low_bit.py::test_low_bit_sharded_step_is_within_the_formats_bound_of_float32[sync1-7.0]',
        'test_sharded_low_bit.py::test_sharded_step_equals_the_replicated_step_with_the_same_grad_sync[False]',
        'test_sharded_low_bit.py::test_block_scaled_sharded_step_is_within_twice_the_bound_of_the_replicated_one',
    ),
    'test_sharded_low_bit.py::test_compiled_sharded_step_sends_the_gradients_in_the_payload_format[True]': (
        'test_sharded_low_bit.py::test_compiled_sharded_step_sends_the_gradients_in_the_payload_format[False]',
        'test_sharded_low_bit.py::test_lamb_trust_ratios_of_a_model_sharded_layer_match_the_replicated_layout',
        'test_sharded_low_bit.py::test_error_feedback_residual_is_sharded_checkpointed_and_kept_on_a_skip',
    ),
    # test_parallel_steps.py
    'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[lars-data-psum]': (
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
        'test_parallel_steps.py::test_aux_is_averaged_and_counts_are_summed',
    ),
    'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[lamb-torus-psum]': (
        'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[bounded_lars-torus-torus]',
        'test_parallel_steps.py::test_bfloat16_compute_keeps_float32_state',
    ),
    'test_parallel_steps.py::test_ring_and_torus_equal_psum[torus-torus]': (
        'test_parallel_steps.py::test_ring_and_torus_equal_psum[torus-ring]',
        'test_parallel_steps.py::test_one_device_batch_b_equals_8_devices[bounded_lars-torus-torus]',
    ),
    'test_parallel_steps.py::test_ring_and_torus_equal_psum[data-ring]': (
        'test_parallel_steps.py::test_ring_and_torus_equal_psum[torus-ring]',
        'test_parallel_steps.py::test_aux_is_averaged_and_counts_are_summed',
    ),
    'test_parallel_steps.py::test_trust_ratio_summary_in_metrics[pmap]': (
        'test_parallel_steps.py::test_trust_ratio_summary_in_metrics[jit]',
        'test_parallel_steps.py::test_pmap_equals_jit',
        'test_api_docs.py::test_doctest[date_optax.current_learning_rate]',
    ),
    # test_batch_norm.py
    'test_batch_norm.py::test_groups_match_reference[8-2-vmap]': (
        'test_batch_norm.py::test_groups_match_reference[8-2-pmap]',
    ),
    'test_batch_norm.py::test_groups_match_reference[None-None-vmap]': (
        'test_batch_norm.py::test_groups_match_reference[8-2-pmap]',
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
    'test_batch_norm.py::test_linen_and_nnx_agree[kw0]': (
        'test_batch_norm.py::test_linen_and_nnx_agree[kw1]',
        'test_batch_norm.py::test_bad_construction_raises[kw0-epsilon]',
    ),
    'test_batch_norm.py::test_groups_match_reference[2-None-vmap]': (
        'test_batch_norm.py::test_groups_match_reference[2-2-shard_map]',
    ),
    'test_batch_norm.py::test_whole_batch_equals_flax_linen[True-False-None]': (
        'test_batch_norm.py::test_whole_batch_equals_flax_linen[True-False-16]',
    ),
    'test_batch_norm.py::test_whole_batch_equals_flax_linen[True-True-None]': (
        'test_batch_norm.py::test_whole_batch_equals_flax_linen[True-True-16]',
    ),
    'test_batch_norm.py::test_ghost_on_one_device_matches_reference[2]': (
        'test_batch_norm.py::test_ghost_on_one_device_matches_reference[4]',
    ),
    # test_batch_schedule.py
    'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[0]': (
        'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[1]',
    ),
    'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[4]': (
        'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[1]',
    ),
    'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[2]': (
        'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[1]',
    ),
    'test_batch_schedule.py::test_fixed_schedule_honours_the_scaling_rules[kw2]': (
        'test_batch_schedule.py::test_fixed_schedule_honours_the_scaling_rules[kw0]',
        'test_batch_schedule.py::test_a_run_longer_than_the_count_is_refused',
        'test_batch_schedule.py::test_a_skipped_step_moves_neither_the_clock_nor_the_decision',
    ),
    'test_batch_schedule.py::test_adaptive_matches_reference[2]': (
        'test_batch_schedule.py::test_adaptive_matches_reference[1]',
    ),
    'test_batch_schedule.py::test_adaptive_matches_reference[5]': (
        'test_batch_schedule.py::test_adaptive_matches_reference[1]',
    ),
    'test_batch_schedule.py::test_resume_is_exact[ramp]': (
        'test_batch_schedule.py::test_resume_is_exact[adaptive]',
        'test_batch_schedule.py::test_a_checkpoint_of_an_older_layout_restores[1]',
    ),
    'test_batch_schedule.py::test_doubling_matches_reference[4-7-64-2]': (
        'test_batch_schedule.py::test_doubling_matches_reference[16-480-1024-2]',
    ),
    'test_batch_schedule.py::test_fixed_schedule_honours_the_scaling_rules[kw1]': (
        'test_batch_schedule.py::test_fixed_schedule_honours_the_scaling_rules[kw0]',
        'test_batch_schedule.py::test_a_run_longer_than_the_count_is_refused',
        'test_batch_schedule.py::test_a_skipped_step_moves_neither_the_clock_nor_the_decision',
        'test_engine.py::test_scaling_rule_choices',
    ),
    'test_batch_schedule.py::test_growing_step_equals_fixed_step_at_each_size[None]': (
        'test_batch_schedule.py::test_growing_step_equals_fixed_step_at_each_size[2]',
    ),
    'test_batch_schedule.py::test_growing_step_equals_fixed_step_at_each_size[1]': (
        'test_batch_schedule.py::test_growing_step_equals_fixed_step_at_each_size[2]',
    ),
    'test_batch_schedule.py::test_a_checkpoint_of_an_older_layout_restores[2]': (
        'test_batch_schedule.py::test_a_checkpoint_of_an_older_layout_restores[1]',
    ),
    'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[3]': (
        'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[1]',
    ),
    'test_batch_schedule.py::test_adaptive_matches_reference[0]': (
        'test_batch_schedule.py::test_adaptive_matches_reference[1]',
    ),
    'test_batch_schedule.py::test_adaptive_matches_reference[3]': (
        'test_batch_schedule.py::test_adaptive_matches_reference[1]',
    ),
    'test_batch_schedule.py::test_adaptive_matches_reference[4]': (
        'test_batch_schedule.py::test_adaptive_matches_reference[1]',
    ),
    'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[5]': (
        'test_batch_schedule.py::test_adaptive_stretch_guard_and_skips_match_reference[1]',
    ),
    # test_low_precision.py
    'test_low_precision.py::test_aps_error_bound_per_layer[int8-torus]': (
        'test_low_precision.py::test_aps_error_bound_per_layer[int8-ring]',
        'test_low_precision.py::test_non_finite_gradient_arrives_as_nan[float4_e2m1fn-False]',
    ),
    'test_low_precision.py::test_aps_error_bound_per_layer[float8_e4m3fn-psum]': (
        'test_low_precision.py::test_aps_error_bound_per_layer[float8_e4m3fn-ring]',
        'test_error_feedback.py::test_error_feedback_changes_nothing_when_the_payload_is_exact',
    ),
    'test_low_precision.py::test_non_finite_gradient_arrives_as_nan[int8-True]': (
        'test_low_precision.py::test_non_finite_gradient_arrives_as_nan[float4_e2m1fn-False]',
        'test_low_precision.py::test_aps_error_bound_per_layer[int8-ring]',
    ),
    'test_low_precision.py::test_ring_rounds_every_partial_sum_like_the_reference[bfloat16-False]': (
        'test_low_precision.py::test_ring_rounds_every_partial_sum_like_the_reference[float4_e2m1fn-False]',
    ),
    'test_low_precision.py::test_aps_error_bound_per_layer[float4_e2m1fn-ring]': (
        'test_low_precision.py::test_aps_error_bound_per_layer[float8_e4m3fn-ring]',
    ),
    'test_low_precision.py::test_ring_rounds_every_partial_sum_like_the_reference[int8-True]': (
        'test_low_precision.py::test_ring_rounds_every_partial_sum_like_the_reference[float4_e2m1fn-False]',
        'test_low_precision.py::test_aps_error_bound_per_layer[int8-ring]',
    ),
    'test_low_precision.py::test_aps_error_bound_per_layer[bfloat16-ring]': (
        'test_low_precision.py::test_aps_error_bound_per_layer[float8_e4m3fn-ring]',
    ),
    'test_low_precision.py::test_ring_rounds_every_partial_sum_like_the_reference[float8_e4m3fn-True]': (
        'test_low_precision.py::test_ring_rounds_every_partial_sum_like_the_reference[float4_e2m1fn-False]',
        'test_low_precision.py::test_aps_error_bound_per_layer[float8_e4m3fn-ring]',
    ),
    # test_error_feedback.py
    'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[psum-False]': (
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
        'test_error_feedback.py::test_error_feedback_changes_nothing_when_the_payload_is_exact',
    ),
    'test_error_feedback.py::test_every_rounding_is_fed_back[torus-fp8-aps]': (
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
        'test_error_feedback.py::test_error_feedback_delivers_what_compression_dropped',
        'test_error_feedback.py::test_error_feedback_changes_nothing_when_the_payload_is_exact',
    ),
    'test_error_feedback.py::test_two_stage_error_feedback_matches_numpy[torus-False]': (
        'test_error_feedback.py::test_two_stage_error_feedback_matches_numpy[ring-False]',
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
        'test_error_feedback.py::test_block_scaled_error_feedback_matches_numpy[False]',
    ),
    'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-False]': (
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
        'test_error_feedback.py::test_bfloat16_residuals_halve_the_memory_and_keep_the_accuracy',
    ),
    'test_error_feedback.py::test_block_scaled_error_feedback_matches_numpy[True]': (
        'test_error_feedback.py::test_block_scaled_error_feedback_matches_numpy[False]',
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
    ),
    'test_error_feedback.py::test_every_rounding_is_fed_back[ring-bf16]': (
        'test_error_feedback.py::test_every_rounding_is_fed_back[torus-int4-shift-sharded]',
        'test_error_feedback.py::test_error_feedback_changes_nothing_when_the_payload_is_exact',
    ),
    'test_error_feedback.py::test_two_stage_error_feedback_matches_numpy[psum-True]': (
        'test_error_feedback.py::test_two_stage_error_feedback_matches_numpy[ring-False]',
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
        'test_error_feedback.py::test_error_feedback_changes_nothing_when_the_payload_is_exact',
        'test_parallel_collectives.py::test_reduce_scatter_layout_matches_partition_spec[2x4]',
        'test_sharded_low_bit.py::test_lamb_trust_ratios_of_a_model_sharded_layer_match_the_replicated_layout',
    ),
    'test_error_feedback.py::test_two_stage_error_feedback_matches_numpy[psum-False]': (
        'test_error_feedback.py::test_two_stage_error_feedback_matches_numpy[ring-False]',
        'test_error_feedback.py::test_error_feedback_delivers_what_compression_dropped',
        'test_error_feedback.py::test_error_feedback_changes_nothing_when_the_payload_is_exact',
    ),
    # test_optimizer_corners.py
    'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[adam-options4]': (
        'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[momentum-options0]',
        'test_optimizer_corners.py::test_baseline_routes_base_options',
        'test_cli_plan.py::test_a_candidate_that_fails_to_compile_does_not_hide_the_others',
    ),
    'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[nesterov-options1]': (
        'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[momentum-options0]',
    ),
    'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[rmsprop-options3]': (
        'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[momentum-options0]',
        'test_optimizer_corners.py::test_baseline_routes_base_options',
    ),
    'test_optimizer_corners.py::test_update_dtype_is_promoted[bounded_lars]': (
        'test_optimizer_corners.py::test_update_dtype_is_promoted[lamb]',
        'test_optimizer_corners.py::test_update_dtype_is_promoted[trust_ratio]',
        'test_optimizer_corners.py::test_bounded_lars_rmsprop_decay_in_base_options',
        'test_optimizer_corners.py::test_bounded_lars_complex_matches_reference[momentum]',
        'test_cli_plan.py::test_a_candidate_that_fails_to_compile_does_not_hide_the_others',
    ),
    'test_optimizer_corners.py::test_update_dtype_is_promoted[lars]': (
        'test_optimizer_corners.py::test_update_dtype_is_promoted[lamb]',
        'test_optimizer_corners.py::test_update_dtype_is_promoted[trust_ratio]',
        'test_optimizer_corners.py::test_lars_complex_matches_reference[norm_of_sum]',
    ),
    'test_optimizer_corners.py::test_float32_params_bfloat16_grads_promote_like_optax[lars]': (
        'test_optimizer_corners.py::test_float32_params_bfloat16_grads_promote_like_optax[lamb]',
        'test_optimizer_corners.py::test_lars_complex_matches_reference[norm_of_sum]',
    ),
    'test_optimizer_corners.py::test_lamb_complex_equals_optax[kw0]': (
        'test_optimizer_corners.py::test_lamb_complex_equals_optax[kw1]',
        'test_optimizer_corners.py::test_bounded_lars_complex_matches_reference[momentum]',
    ),
    'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[adagrad-options2]': (
        'test_optimizer_corners.py::test_bounded_lars_deprecated_keywords_warn_and_match_base_options[momentum-options0]',
        'test_optimizer_corners.py::test_baseline_routes_base_options',
        'test_transforms.py::test_bounded_lars_matches_reference[gradient-adagrad]',
    ),
    'test_optimizer_corners.py::test_bounded_lars_complex_matches_reference[adam]': (
        'test_optimizer_corners.py::test_bounded_lars_complex_matches_reference[momentum]',
        'test_optimizer_corners.py::test_baseline_routes_base_options',
        'test_cli_plan.py::test_a_candidate_that_fails_to_compile_does_not_hide_the_others',
    ),
    'test_optimizer_corners.py::test_mask_rule_lamb[neither]': (
        'test_optimizer_corners.py::test_mask_rule_lamb[both]',
        'test_optimizer_corners.py::test_bounded_lars_complex_matches_reference[momentum]',
    ),
    # test_two_shot.py
    'test_two_shot.py::test_nothing_is_lost_only_delayed[int4-bf16-residuals]': (
        'test_two_shot.py::test_nothing_is_lost_only_delayed[torus-int8-shift-stochastic]',
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
    ),
    'test_two_shot.py::test_pmap_two_shot_equals_the_mesh_step_bit_for_bit': (
        'test_two_shot.py::test_nothing_is_lost_only_delayed[torus-int8-shift-stochastic]',
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
        'test_residual_restore.py::test_a_state_without_residuals_starts_from_zeros[pmap-two_shot]',
    ),
    'test_two_shot.py::test_nothing_is_lost_only_delayed[fp8-aps-sharded]': (
        'test_two_shot.py::test_nothing_is_lost_only_delayed[torus-int8-shift-stochastic]',
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
        'test_two_shot.py::test_exact_two_shot_is_the_mean',
        'test_two_shot.py::test_rows_encoded_alone_are_the_whole_buffer_encoded_at_once[float8_e4m3fn]',
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
        'test_hierarchical_sync.py::test_sharded_builder_over_slices_and_a_model_axis',
    ),
    'test_two_shot.py::test_rows_encoded_alone_are_the_whole_buffer_encoded_at_once[int8]': (
        'test_two_shot.py::test_rows_encoded_alone_are_the_whole_buffer_encoded_at_once[float8_e4m3fn]',
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
    ),
    'test_two_shot.py::test_two_shot_matches_numpy_over_five_steps[True-True]': (
        'test_two_shot.py::test_two_shot_matches_numpy_over_five_steps[False-False]',
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
        'test_two_shot.py::test_exact_two_shot_is_the_mean',
        'test_error_feedback.py::test_error_feedback_matches_numpy_over_several_steps[ring-True]',
        'test_hierarchical_sync.py::test_sharded_builder_over_slices_and_a_model_axis',
    ),
    'test_two_shot.py::test_two_shot_matches_numpy_over_five_steps[False-True]': (
        'test_two_shot.py::test_two_shot_matches_numpy_over_five_steps[False-False]',
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
    ),
    'test_two_shot.py::test_two_shot_on_the_sharded_builder_matches_numpy[True]': (
        'test_two_shot.py::test_two_shot_on_the_sharded_builder_matches_numpy[False]',
        'test_hierarchical_sync.py::test_sharded_builder_over_slices_and_a_model_axis',
    ),
    'test_two_shot.py::test_nothing_is_lost_only_delayed[int4-blocks]': (
        'test_two_shot.py::test_nothing_is_lost_only_delayed[torus-int8-shift-stochastic]',
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
    ),
    'test_two_shot.py::test_rows_encoded_alone_are_the_whole_buffer_encoded_at_once[int4]': (
        'test_two_shot.py::test_rows_encoded_alone_are_the_whole_buffer_encoded_at_once[float8_e4m3fn]',
        'test_two_shot.py::test_a_nan_on_one_replica_arrives_as_nan_and_the_step_skips',
    ),
    # test_tpu_generations.py
    'test_tpu_generations.py::test_builders_run_over_slices_and_data_as_over_one_axis[sharded]': (
        'test_tpu_generations.py::test_builders_run_over_slices_and_data_as_over_one_axis[shard_update]',
        'test_grad_stats.py::test_statistics_on_the_sharded_mesh_cost_little_memory_traffic',
    ),
    'test_tpu_generations.py::test_hierarchical_sync_compresses_only_what_crosses_slices[v5e-4-formats0]': (
        'test_tpu_generations.py::test_hierarchical_sync_compresses_only_what_crosses_slices[v4-8-formats1]',
        'test_tpu_generations.py::test_a_slice_has_the_devices_its_vm_lists[v5litepod-4-4-16]',
        'test_api_docs.py::test_doctest[date_optax.parallel.all_reduce]',
    ),
    'test_tpu_generations.py::test_builders_run_over_slices_and_data_as_over_one_axis[replicated]': (
        'test_tpu_generations.py::test_builders_run_over_slices_and_data_as_over_one_axis[shard_update]',
        'test_tpu_generations.py::test_a_step_over_two_slices_reduces_inside_each_and_across_by_dcn',
    ),
    # test_demo.py
    'test_demo.py::test_date_run_bounds_its_ratios[options0-bounds0]': (
        'test_demo.py::test_date_run_bounds_its_ratios[options1-bounds1]',
    ),
    # test_leaf_kinds.py
    'test_leaf_kinds.py::test_leaf_kinds_property[lamb]': (
        'test_leaf_kinds.py::test_leaf_kinds_property[lars]',
        'test_leaf_kinds.py::test_leaf_kinds_property[bounded_lars momentum]',
        'test_leaf_kinds.py::test_leaf_kinds_property[scale_by_trust_ratio]',
        'test_leaf_kinds.py::test_a_gradient_of_none_where_a_parameter_is_an_array[lamb]',
        'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[lars]',
        'test_optimizer_corners.py::test_lamb_complex_equals_optax[kw1]',
    ),
    'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[bounded_lars]': (
        'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[lars]',
        'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[bounded_lars momentum]',
        'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[scale_by_trust_ratio]',
        'test_leaf_kinds.py::test_a_gradient_of_none_where_a_parameter_is_an_array[bounded_lars]',
    ),
    'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[adascale]': (
        'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[bounded_lars momentum]',
        'test_leaf_kinds.py::test_a_gradient_of_none_where_a_parameter_is_an_array[adascale]',
        'test_leaf_kinds.py::test_every_refused_leaf_is_named_on_init_and_update[adascale-PRNG key]',
    ),
    'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[lamb]': (
        'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[lars]',
        'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[scale_by_trust_ratio]',
        'test_leaf_kinds.py::test_every_taken_leaf_computes_what_optax_computes[bounded_lars momentum]',
        'test_leaf_kinds.py::test_a_gradient_of_none_where_a_parameter_is_an_array[lamb]',
        'test_optimizer_corners.py::test_lamb_complex_equals_optax[kw1]',
    ),
    # test_stochastic_rounding.py
    'test_stochastic_rounding.py::test_stochastic_error_bound_per_layer[float4_e2m1fn-ring]': (
        'test_stochastic_rounding.py::test_stochastic_error_bound_per_layer[int8-ring]',
        'test_stochastic_rounding.py::test_stochastic_round_is_an_unbiased_choice_between_the_neighbours[bfloat16]',
    ),
    # test_checkpoint_paths.py
    'test_checkpoint_paths.py::test_damaged_residuals_restore_their_step_with_zeros_and_a_warning[truncated]': (
        "test_checkpoint_paths.py::test_damaged_residuals_restore_their_step_with_zeros_and_a_warning[another step's]",
        'test_checkpoint_paths.py::test_a_directory_that_does_not_exist_is_made_by_the_first_save_only',
    ),
    # test_hierarchical_sync.py
    'test_hierarchical_sync.py::test_error_feedback_matches_numpy_over_three_steps[int8-True]': (
        'test_hierarchical_sync.py::test_error_feedback_matches_numpy_over_three_steps[int4-False]',
        'test_hierarchical_sync.py::test_ring_across_slices_loses_nothing_with_sharded_updates',
        'test_hierarchical_sync.py::test_sharded_builder_over_slices_and_a_model_axis',
    ),
    'test_hierarchical_sync.py::test_error_feedback_matches_numpy_over_three_steps[int8-False]': (
        'test_hierarchical_sync.py::test_error_feedback_matches_numpy_over_three_steps[int4-False]',
        'test_hierarchical_sync.py::test_more_than_two_data_axes_keep_all_but_the_first_inside_the_slice',
    ),
    # test_torus_order.py
    'test_torus_order.py::test_the_compiled_ring_and_torus_send_only_over_links[v3-32]': (
        'test_torus_order.py::test_the_compiled_ring_and_torus_send_only_over_links[v4-32]',
        'test_torus_order.py::test_meshes_for_rings_step_over_one_link[v2-8]',
    ),
    # test_schedules.py
    'test_schedules.py::test_jit_matches_eager_and_is_float32[<lambda>4]': (
        'test_schedules.py::test_jit_matches_eager_and_is_float32[<lambda>3]',
        'test_schedules.py::test_jit_matches_eager_and_is_float32[<lambda>0]',
        'test_schedules.py::test_exponential_equals_multistep_with_unit_boundaries',
    ),
    'test_schedules.py::test_multistep_matches_reference[spe4]': (
        'test_schedules.py::test_multistep_matches_reference[spe0]',
    ),
}
