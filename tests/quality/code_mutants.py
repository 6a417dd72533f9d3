"""Seeded one-line bugs in the code around the table, and the tests that must kill each.

Legend
    mutant   `CodeMutant`: in `path`, the exact text `old` (it must occur once) becomes `new`;
             `tests` are the pytest node ids (or files) expected to fail on it
    killed   the expected tests fail on the mutant (any failure, error or timeout), while the
             same tests pass on the unmutated tree (the baseline run first)
    classes  the bug classes issue 12 found surviving are marked ``survivor``; the rest are
             bugs in the runtime code the issue added or touched

The table's own mutants live in `proofs.mutants`; these are the runtime, the core, the dealer,
the policy and the conformance checker.  `make mutants` runs every one (minutes: each runs its
tests in a copy of the working tree); `tests/test_code_mutants.py` checks, in CI, that every
mutant still applies to the current source (a refactor that moves the text must move the mutant).

    python tests/quality/code_mutants.py [--only NAME ...] [--list] [--hypothesis-seeds 11,12,13]

``--hypothesis-seeds`` runs only the mutants whose tests include a hypothesis property, each once per seed
(``pytest --hypothesis-seed``, no example database carried between runs): a mutant killed under some seeds
only is killed by luck, as one was until 2026-12-05 (`hypothesis_mutants`).
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
G = "tests/test_runtime_guarantees.py::"
R = "tests/test_runtime_replicas.py::"
C = "tests/test_conformance.py::"
P = "tests/test_pool.py::"
V = "tests/test_vlm.py::"
X = "tests/test_exchange.py::"
K = "tests/test_check_packing.py::"
E = "tests/test_runtime_exchange.py::"


@dataclass(frozen=True)
class CodeMutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    doc: str
    survivor: bool = False  # a bug class issue 12 found surviving the suite


MUTANTS: tuple[CodeMutant, ...] = (
    # -- the classes that survived before issue 12 ------------------------------------------------------------
    CodeMutant("header_st_from_live_quit", "odb/core/rank.py",
               'st=s.payload["st"], round=self._posted', "st=self._status_fn(), round=self._posted",
               (G + "test_the_header_carries_the_status_the_row_posted_not_a_later_one",),
               "the header's status is read from the live quit instead of the row's payload", True),
    CodeMutant("propose_with_world_size", "odb/core/replica.py",
               'proposal = int(policy.propose(summaries, cfg["W"]))',
               "proposal = int(policy.propose(summaries, len(summaries)))",
               ("tests/test_core.py::test_round_proposal_asks_the_policy_with_the_window_and_skips_it_when_the_round_aborts",),
               "propose called with the world size instead of W", True),
    CodeMutant("packed_one_token_over", "odb/batching/grouping.py", "if tot + v <= B:", "if tot + v <= B + 1:",
               ("tests/test_batching_policy.py::test_pack_fills_an_additive_budget_exactly_and_never_one_token_over",),
               "packed grouping allows one token over the budget", True),
    CodeMutant("reservoir_rounds_down", "odb/batching/policy.py", "t = qt + (t - qt + 1) // 2", "t = qt + (t - qt) // 2",
               ("tests/test_batching_policy.py::test_a_large_window_carries_half_its_full_groups_while_data_flows",),
               "the policy's reservoir rounds an odd need down", True),
    CodeMutant("loss_scale_slots_swapped", "odb/core/info.py",
               'LOSS_BASES = {"tokens": 0, "label_tokens": 1, "samples": 2}',
               'LOSS_BASES = {"tokens": 1, "label_tokens": 0, "samples": 2}',
               (R + "test_loss_scale_equals_its_definition_at_every_step_on_every_rank",),
               "the tokens and label_tokens slots of loss_scale swapped", True),
    CodeMutant("shift_counts_the_head", "odb/runtime/source.py", "labels = labels[1:]", "labels = labels[:-1]",
               (G + "test_count_labels_shift_counts_the_targets_after_the_first_position",),
               "shift_labels counts labels[:-1]", True),
    CodeMutant("state_drops_complete", "odb/runtime/ledger.py", 'self.done, self.complete = _positions(rec["done"], now), rec["complete"]',
               'self.done, self.complete = _positions(rec["done"], now), False',
               (G + "test_resuming_from_a_completed_pass_starts_the_epoch_again",),
               "load_state_dict drops the complete flag", True),
    CodeMutant("checker_skips_read_inputs", "proofs/conformance/check.py",
               "if k in collective and want.get(k) != v:", "if False and k in collective and want.get(k) != v:",
               (C + "test_a_tampered_trace_is_rejected[tamper_read_input]",),
               "the conformance checker no longer compares the inputs a rank read with the collective", True),
    CodeMutant("checker_skips_the_policy", "proofs/conformance/check.py",
               "if recomputed != proposal:", "if False:",
               (C + "test_proposals_from_another_rule_agreed_by_every_rank_are_caught_by_recomputing_the_policy",),
               "the conformance checker no longer recomputes the policy's proposal", True),
    # -- replicated decisions ----------------------------------------------------------------------------------------
    CodeMutant("digest_not_checked", "odb/core/replica.py", "for name in REPLICATED:", "for name in ():",
               (R + "test_replicas_that_diverge_fail_every_rank_in_the_same_round_naming_the_field",
                R + "test_ranks_on_different_epochs_all_get_a_config_error_before_any_batch"),
               "the replicated fields are posted but never compared"),
    CodeMutant("needs_from_own_prefetch", "odb/runtime/group.py", "return tuple(row[-1] for row in rows)",
               "return (int(ahead),) * self.world_size",
               (R + "test_dealt_ranks_with_different_workers_emit_every_sample_exactly_once",),
               "every rank uses its own prefetch for every rank's need (the bug behind issue 12)"),
    CodeMutant("lead_from_own_prefetch", "odb/runtime/epoch_pass.py", "lead=first_lead(loader.layout.window, aheads)",
               "lead=first_lead(loader.layout.window, (loader._source.ahead,))",
               (R + "test_dealt_ranks_with_different_workers_emit_every_sample_exactly_once",),
               "the first deal's lead reads this rank's own prefetch"),
    CodeMutant("agree_first_and_last_rank", "odb/core/replica.py", "if (col == col[0]).all():",
               "if col[0] == col[-1]:",
               ("tests/test_core.py::test_a_replicated_field_that_differs_on_one_middle_rank_alone_fails_every_replica",),
               "the replicated fields are compared between the first and the last rank only"),
    CodeMutant("headers_of_any_width", "odb/core/header.py", "if a.ndim != 2 or a.shape[1] != self.length:",
               "if a.ndim != 2:",
               ("tests/test_core.py::test_every_ranks_headers_decoded_at_once_read_as_each_header_decoded_alone",),
               "gathered headers of another length are read with this layout's field offsets"),
    CodeMutant("epoch_not_posted", "odb/core/rank.py", "epoch=self.epoch, digest=digest,", "epoch=0, digest=digest,",
               (R + "test_ranks_on_different_epochs_all_get_a_config_error_before_any_batch",),
               "the header carries no epoch"),
    CodeMutant("abort_round_asks_the_policy", "odb/core/replica.py",
               "    if evaluate(Let(\"abort\"), Scope(inputs=inputs, cfg=cfg, lets=table.let_map)):\n        return lo, inputs\n",
               "", (R + "test_a_policy_failure_on_one_rank_takes_every_rank_out_through_the_abort_row[summarize]",),
               "the proposal is asked for in an abort round (a failing rank's placeholder summary reaches it)"),
    CodeMutant("intake_failure_swallowed", "odb/batching/deal.py",
               "    return intake_sizes(groups(window, cost), W)\n",
               "    try:\n        return intake_sizes(groups(window, cost), W)\n    except Exception:\n"
               "        return [len(window)] * len(intake_ladder(W))\n",
               (R + "test_a_policy_failure_on_one_rank_takes_every_rank_out_through_the_abort_row[intake]",),
               "a failure of the dealt intake bound is swallowed and the whole window posted as the bound"),
    CodeMutant("construction_check_drops_a_field", "odb/core/shared.py",
               "for j, name in enumerate(names) if len(", "for j, name in enumerate(names[:-1]) if len(",
               ("tests/test_runtime_dist.py::test_ranks_that_build_their_loaders_differently_all_get_a_config_error",
                "tests/test_core.py::test_the_construction_check_vector_is_generated_from_every_shared_field"),
               "the construction check leaves the last setting out (the order: shuffle, seed, length)"),
    CodeMutant("callable_cost_by_name", "odb/core/shared.py",
               'return f"callable {cost.name}(budgets={list(cost.budgets)}) {_describe_fn(cost.fn)}"',
               'return "callable"',
               (R + "test_the_construction_check_compares_costs_by_value_and_prints_them",),
               "a callable cost is compared by its kind only"),
    CodeMutant("counts_reduced_by_max", "odb/runtime/transport.py",
               "all_reduce(self._sums, op=op.SUM", "all_reduce(self._sums, op=op.MAX",
               (R + "test_loss_scale_equals_its_definition_at_every_step_on_every_rank",
                "tests/test_runtime_dist.py::test_the_transport_gathers_the_headers_and_reduces_the_counts_as_reduce_posts_does"),
               "the collective takes the largest rank's counts instead of their sum"),
    CodeMutant("gathered_counts_of_rank0", "odb/runtime/transport.py",
               "a[:, h:].sum(axis=0).tolist()", "(len(a) * a[0, h:]).tolist()",
               (R + "test_loss_scale_equals_its_definition_at_every_step_on_every_rank",
                "tests/test_runtime_dist.py::test_the_transport_gathers_the_headers_and_reduces_the_counts_as_reduce_posts_does"),
               "the gathered counts are rank 0's, taken for every rank's"),
    CodeMutant("counts_mode_inverted", "odb/runtime/transport.py",
               'return "gather" if world_size * (header_len + 3 * window) <= GATHER_LIMIT else "reduce"',
               'return "reduce" if world_size * (header_len + 3 * window) <= GATHER_LIMIT else "gather"',
               ("tests/test_core.py::test_the_transport_gathers_while_a_round_stays_small_and_reduces_past_it",),
               "the transport reduces small rounds and gathers large ones"),
    CodeMutant("header_slot_wrong", "odb/runtime/transport.py",
               "self._sums[self.rank * h:(self.rank + 1) * h] =", "self._sums[0:h] =",
               ("tests/test_runtime_dist.py::test_the_transport_gathers_the_headers_and_reduces_the_counts_as_reduce_posts_does",),
               "every rank writes its header into rank 0's slot"),
    CodeMutant("tokens_max_summed", "odb/runtime/transport.py",
               "all_reduce(self._maxes, op=op.MAX", "all_reduce(self._maxes, op=op.SUM",
               ("tests/test_runtime_dist.py::test_the_transport_gathers_the_headers_and_reduces_the_counts_as_reduce_posts_does",),
               "the collective sums every rank's tokens per step where the straggler estimate needs the largest"),
    CodeMutant("release_skips_last_rank", "odb/core/header.py",
               "totals = [sum(c) for c in zip(*(p.counts for p in posts))]",
               "totals = [sum(c) for c in zip(*(p.counts for p in (posts[:-1] or posts)))]",
               ("tests/test_core.py::test_the_collective_sums_the_counts_and_keeps_each_batchs_largest_tokens",
                "tests/test_differential.py"),
               "the simulation's global counts leave out the last rank"),
    # -- bad input, labels, fillers ----------------------------------------------------------------------------------
    CodeMutant("labels_without_ids_fallback", "odb/runtime/source.py", 'labels = sample.get("input_ids")',
               "labels = None", (G + "test_samples_without_labels_count_the_label_tokens_pad_collate_builds",),
               "samples without labels count 0 label tokens"),
    CodeMutant("zero_labels_silent", "odb/core/rank.py",
               "if self.loss_slot == 1 and self._labels_seen == 0 and",
               "if False and self._labels_seen == 0 and",
               (G + "test_labels_all_masked_raise_on_every_rank_instead_of_training_with_zero_weights",
                R + "test_labels_all_masked_raise_on_every_rank_after_the_same_step"),
               "an epoch without one label token trains with every loss_scale 0"),
    CodeMutant("length_ignores_shape", "odb/runtime/source.py", "if len(shape) != 1:", "if len(shape) > 2:",
               (G + "test_input_ids_that_are_not_one_dimensional_raise_with_the_index",),
               "a [1, n] input_ids is measured as one token"),
    CodeMutant("length_accepts_floats", "odb/runtime/source.py", "return operator.index(v)", "return int(v)",
               (G + "test_a_length_fn_must_return_ints",), "a float or string length is truncated"),
    CodeMutant("filler_first_sample", "odb/core/rank.py",
               "if fits:  # fillers replay the cheapest sample within budget seen (never an oversize one)\n"
               "                if self._template is None or c < self._template_cost:",
               "if True:\n                if self._template is None:",
               (R + "test_fillers_replay_the_cheapest_sample_within_the_budget_never_an_oversize_one",),
               "fillers replay the rank's first sample, over budget or not"),
    CodeMutant("empty_samples_enter_the_window", "odb/core/rank.py", "if sizes[0] == 0:", "if False:",
               ("tests/test_runtime_single.py::test_dropped_and_empty_samples_are_counted_never_silent",),
               "a zero-length sample is emitted instead of counted"),
    # -- lifecycle and errors ----------------------------------------------------------------------------------------
    CodeMutant("consumer_catches_everything", "odb/runtime/epoch_pass.py", "except queue.Empty:  # make sure",
               "except Exception:  # make sure",
               (G + "test_a_signal_handlers_exception_reaches_the_training_loop",
                G + "test_a_dead_worker_is_seen_at_once_not_after_timeout_s"),
               "the consumer's wait swallows every exception as queue.Empty"),
    CodeMutant("collate_wraps_signal_errors", "odb/runtime/epoch_pass.py", "if _from_signal_handler(e):", "if False:",
               (G + "test_a_signal_handlers_exception_inside_collate_is_not_reported_as_a_collate_error",),
               "a signal handler's exception inside collate_fn is reported as a collate error"),
    CodeMutant("direct_path_despite_pinning", "odb/runtime/source.py",
               "self._direct = wrapped if num_workers == 0 and not pin_memory else None",
               "self._direct = wrapped if num_workers == 0 else None",
               ("tests/test_runtime_single.py::test_the_direct_path_yields_what_the_inner_dataloader_yields",),
               "pin_memory=True without workers skips the inner DataLoader, so nothing is pinned"),
    CodeMutant("direct_path_reads_positions_as_keys", "odb/runtime/source.py", "    if keys is None:\n        return iter(wrapped)",
               "    if True:\n        return iter(wrapped)",
               ("tests/test_runtime_single.py::test_the_direct_path_yields_what_the_inner_dataloader_yields",),
               "the direct path iterates a map-style wrapper instead of reading it at the sampler's keys"),
    CodeMutant("direct_path_lists_keys_at_start", "odb/runtime/source.py",
               "    return map(wrapped.__getitem__, keys)", "    return map(wrapped.__getitem__, list(keys))",
               ("tests/test_runtime_dealt.py::test_every_sample_is_emitted_exactly_once_and_the_traces_conform",),
               "the direct path reads every key at the epoch's start: dealt keys run out at once, and a rank takes "
               "its whole reserve class before the second deal (nothing lost at one rank; balance lost at N > 1)"),
    CodeMutant("poll_ignores_stop", "odb/runtime/source.py", "if stopping():", "if False:",
               (G + "test_closing_while_the_engine_waits_on_a_hung_worker_returns_at_once",),
               "a fetch waiting on a hung worker ignores the rank's stop"),
    CodeMutant("set_epoch_unchecked", "odb/runtime/loader.py",
               "if self._open_pass() and epoch != self.epoch:", "if False:",
               (G + "test_set_epoch_while_a_pass_is_open_is_refused_and_cannot_corrupt_the_next_epoch",),
               "set_epoch during an open pass"),
    CodeMutant("closed_iterator_unchecked", "odb/runtime/epoch_pass.py",
               "        if loader.closed:\n            self.open = False\n",
               "        if False:\n            self.open = False\n",
               (G + "test_a_closed_loaders_iterator_raises_a_clear_error",), "a closed loader's iterator goes on"),
    CodeMutant("state_ranges_unbounded", "odb/runtime/ledger.py", "or (total >= 0 and rg[1] > total)", "or False",
               (G + "test_load_state_dict_validates_every_field",), "a state's ranges past the end are accepted"),
    CodeMutant("new_group_error_raw", "odb/runtime/group.py",
               "except RuntimeError as e:  # the store barrier", "except KeyError as e:  # the store barrier",
               (R + "test_a_rank_missing_at_construction_gives_rank_failure_within_timeout_s",),
               "a rank missing at construction surfaces as a bare RuntimeError"),
    # (dropping `local["exhausted"]` here instead is equivalent: at return_go buf is the posted n, and a rank posts
    # with buf < W only when its source is exhausted or it stops; docs/decisions/2026-12-01-replicated-decisions.md)
    CodeMutant("join_ends_with_a_sample_held", "odb/core/rank.py",
               'self.local["buf"] == 0 and self.local["exhausted"] and not self._ended:',
               'self.local["buf"] <= 1 and self.local["exhausted"] and not self._ended:',
               (G + "test_join_mode_emits_every_sample_whatever_the_last_window_holds",),
               "a JOIN rank ends its iterator while its window still holds a sample"),
    # -- elastic resume ------------------------------------------------------------------------------------------
    CodeMutant("merge_ignores_steps", "odb/runtime/ledger.py", "if len(steps) > 1 or len(samples) > 1:", "if False:",
               ("tests/test_elastic.py::test_wrong_merges_are_refused_with_a_clear_error",),
               "states from different checkpoints are merged"),
    CodeMutant("reshard_takes_another_slice", "odb/runtime/ledger.py",
               "mine = {(q - rank) // world_size for q in done if q % world_size == rank}",
               "mine = {q // world_size for q in done if q % world_size == (rank + 1) % world_size}",
               ("tests/test_elastic.py::test_a_checkpoint_of_n_ranks_resumes_on_m_and_every_sample_is_emitted_exactly_once",),
               "a merged state marks another rank's slice of the order as this rank's yielded positions"),
    CodeMutant("dealt_resume_forgets_the_merge", "odb/runtime/ledger.py", "mine = set(done)", "mine = set()",
               ("tests/test_elastic.py::test_a_checkpoint_of_n_ranks_resumes_on_m_and_every_sample_is_emitted_exactly_once",),
               "a dealt loader resumed from a merged state forgets what was yielded"),
    # -- the dealer ------------------------------------------------------------------------------------------------
    CodeMutant("reserve_take_not_counted", "odb/batching/deal.py",
               "        self.reserve_taken += 1\n", "",
               ("tests/test_deal_reserve.py::test_reads_past_the_dealt_keys_take_successive_reserve_positions_and_count_them",),
               "a reserve take is not counted (the next one takes the same position; replicas never skip it)"),
    CodeMutant("dealer_forgets_reserve", "odb/batching/deal.py",
               "while self.cursor < self.total and self._reserved_at(self.cursor):", "while False:",
               ("tests/test_deal_reserve.py",), "the dealer deals positions a rank took from its reserve"),
    CodeMutant("intake_bound_without_refill", "odb/batching/deal.py",
               "out = np.maximum(0, int(window) - n) + u", "out = u",
               ("tests/test_dealt.py", "tests/test_deal.py"),
               "the intake bound forgets the refill of the window (ranks take reserves without drops)"),
    CodeMutant("shared_deal_ignores_the_state", "odb/batching/deal.py",
               "key = (fn.__name__, _frozen(self.dealer.state_dict()),", "key = (fn.__name__, (),",
               ("tests/test_deal.py::test_replicas_sharing_deals_reuse_one_only_in_the_same_state_with_the_same_inputs",),
               "simulated replicas reuse a deal computed from another dealer state (a divergence would be masked)"),
    CodeMutant("shared_deal_ignores_the_inputs", "odb/batching/deal.py",
               "tuple(None if a is None else tuple(int(v) for v in a) for a in args))", "())",
               ("tests/test_deal.py::test_replicas_sharing_deals_reuse_one_only_in_the_same_state_with_the_same_inputs",),
               "simulated replicas reuse a deal computed from other gathered numbers"),
    CodeMutant("end_game_ties_by_quicksort", "odb/batching/deal.py",
               '        order = np.argsort(v, kind="stable")', '        order = np.argsort(v, kind="quicksort")',
               ("tests/test_deal.py::test_the_sorted_end_game_picks_what_the_heap_picks_in_its_order",),
               "the sorted end game breaks equal estimates in an arbitrary order, not by rank as the heap does"),
    CodeMutant("end_game_trusts_its_margin", "odb/batching/deal.py",
               "        if (np.bincount(picked, minlength=n) < c).all():", "        if True:",
               ("tests/test_deal.py::test_the_sorted_end_game_picks_what_the_heap_picks_in_its_order",
                "tests/test_deal.py::test_a_margin_too_small_for_the_picks_is_widened_not_trusted"),
               "the sorted end game keeps its picks when a rank's picks used up what was generated for it"),
    CodeMutant("end_game_deals_reserved_positions", "odb/batching/deal.py",
               "        keep = k // w >= self.reserve[k % w]", "        keep = k >= 0",
               ("tests/test_deal.py::test_a_large_end_game_deals_each_rank_the_positions_the_heap_gives_it",),
               "the sorted end game deals positions ranks took from their reserves"),
    CodeMutant("end_game_unstable_parts", "odb/batching/deal.py",
               'np.argsort(key, kind="stable")', 'np.argsort(key, kind="quicksort")',
               ("tests/test_deal.py::test_a_large_end_game_deals_each_rank_the_positions_the_heap_gives_it",),
               "a rank's end-game positions come out of order (an unstable sort by rank)"),
    CodeMutant("array_top_up_over_reserves", "odb/batching/deal.py",
               "if left > k and self.cursor + k <= self._first_reserved():", "if left > k:",
               ("tests/test_deal.py::test_the_array_deal_gives_what_the_loop_over_the_ranks_gives",
                "tests/test_deal.py::test_a_deal_at_scale_tops_up_as_arrays_and_deals_each_position_once"),
               "the array top-up (64 ranks on) deals over positions ranks took from their reserves"),
    CodeMutant("array_top_up_forgets_dealt", "odb/batching/deal.py",
               "        self.dealt = self.dealt + top\n", "        self.dealt = self.dealt\n",
               ("tests/test_deal.py::test_the_array_deal_gives_what_the_loop_over_the_ranks_gives",),
               "the array top-up does not count what it dealt (the next deal over-deals every rank)"),
    CodeMutant("array_checks_let_overdraw_through", "odb/batching/deal.py",
               "if ((res < prev) | (tk < 0) | (tk > dealt)).any():", "if ((res < prev) | (tk < 0)).any():",
               ("tests/test_deal.py::test_the_array_deal_gives_what_the_loop_over_the_ranks_gives",),
               "the array checks accept a rank that reports more taken than it was given"),
    CodeMutant("array_deal_forgets_dry", "odb/batching/deal.py", "        self.closed |= dry != 0\n", "",
               ("tests/test_deal.py::test_the_array_deal_gives_what_the_loop_over_the_ranks_gives",),
               "the array checks do not close a rank that ran dry (it is dealt positions it will never read)"),
    CodeMutant("end_game_own_part_by_a_wrong_mask", "odb/batching/deal.py",
               "self._first = (r, self.free.array()[self.picks == r])",
               "self._first = (r, self.free.array()[self.picks <= r])",
               ("tests/test_deal.py::test_a_large_end_game_deals_each_rank_the_positions_the_heap_gives_it",),
               "a replica's own end-game part, read first, takes the lower ranks' positions too"),
    CodeMutant("levels_phase_order_reversed", "odb/batching/deal.py",
               'return Levels(a, np.argsort(ph, kind="stable"), lo, left, sorted_a, pre)',
               'return Levels(a, np.argsort(-ph, kind="stable"), lo, left, sorted_a, pre)',
               ("tests/test_deal.py::test_the_levels_give_each_rank_the_heaps_picks_wherever_they_answer", "tests/test_deal.py::test_a_large_end_game_from_the_levels_deals_what_the_heap_deals_and_checks_itself_against_the_sort"),
               "the end game's levels order each level's ranks by descending phase"),
    CodeMutant("levels_last_level_by_rank", "odb/batching/deal.py",
               "at = order[a[order] <= level]", "at = np.flatnonzero(a <= level)",
               ("tests/test_deal.py::test_the_levels_give_each_rank_the_heaps_picks_wherever_they_answer", "tests/test_deal.py::test_a_large_end_game_from_the_levels_deals_what_the_heap_deals_and_checks_itself_against_the_sort"),
               "the last level's picks go to the lowest ranks present, not the lowest phases"),
    CodeMutant("levels_trust_meeting_phases", "odb/batching/deal.py",
               "or q[0] + mu - q[-1] < gap or (np.diff(q) < gap).any():", "or q[0] + mu - q[-1] < gap:",
               ("tests/test_deal.py::test_the_levels_give_each_rank_the_heaps_picks_wherever_they_answer", "tests/test_deal.py::test_the_levels_answer_a_realistic_end_game_and_refuse_what_they_cannot_order"),
               "the levels answer although two distinct starts' phases meet (their floats' order is rounding's)"),
    CodeMutant("levels_ignore_the_wrap", "odb/batching/deal.py",
               "or q[0] + mu - q[-1] < gap or", "or",
               ("tests/test_deal.py::test_the_levels_give_each_rank_the_heaps_picks_wherever_they_answer",
                "tests/test_deal.py::test_the_levels_answer_a_realistic_end_game_and_refuse_what_they_cannot_order"),
               "the levels answer although a phase lies just below mu (on the next level, as rounded) or the step rounds away"),
    CodeMutant("levels_before_skips_the_level", "odb/batching/deal.py",
               'return self._below(levels) + np.searchsorted(before, levels, "right")',
               'return self._below(levels) + np.searchsorted(before, levels, "left")',
               ("tests/test_deal.py::test_the_levels_give_each_rank_the_heaps_picks_wherever_they_answer",
                "tests/test_deal.py::test_a_large_end_game_from_the_levels_deals_what_the_heap_deals_and_checks_itself_"
                "against_the_sort"),
               "a rank's picks are placed before the lower phases that start on its own level"),
    CodeMutant("free_at_ignores_the_tail", "odb/batching/deal.py",
               "if past.any():", "if False:",
               ("tests/test_deal.py::test_the_undealt_positions_as_an_array_are_the_undealt_positions",),
               "a replica's end-game positions past the reserve-free head are read as if nothing were reserved"),
    CodeMutant("end_parts_skip_the_cross_check", "odb/batching/deal.py",
               "if self._first is not None and not np.array_equal(self._slice(self._first[0]), self._first[1]):",
               "if False:",
               ("tests/test_deal.py::test_a_large_end_game_from_the_levels_deals_what_the_heap_deals_and_checks_itself_against_the_sort",),
               "a second rank's read no longer compares the levels' first part with the sort's"),
    CodeMutant("partition_check_trusts_budget_costs", "odb/batching/base.py",
               "k = over(groups, window) if over is not None else next(", "k = None if over is not None else next(",
               ("tests/test_batching_policy.py::test_the_partition_check_refuses_a_group_over_budget",),
               "the partition check lets a budget cost's groups over budget through"),
    CodeMutant("first_over_counts_lone_samples", "odb/batching/cost.py",
               "if len(g) > 1 and (len(g) * max(", "if len(g) > 0 and (len(g) * max(",
               ("tests/test_batching_cost.py::test_the_first_group_over_budget_is_the_one_fits_refuses_first",
                "tests/test_batching_policy.py::test_the_partition_check_refuses_a_group_over_budget"),
               "a lone sample over budget (allowed: it goes out alone) fails the partition check"),
    CodeMutant("step_info_fields_crossed", "odb/core/info.py",
               '"local_tokens": local_tokens, "global_tokens": global_tokens',
               '"local_tokens": global_tokens, "global_tokens": local_tokens',
               ("tests/test_core.py::test_a_released_batchs_step_info_is_the_dataclass_built_as_usual",),
               "a released batch's StepInfo carries two fields crossed (the trainer reads the global tokens as its own)"),
    CodeMutant("end_game_lazy_import", "odb/batching/deal.py",
               "    q = _distinct(ph)  ", "    q = np.unique(ph)  ",
               ("tests/test_core.py::test_no_round_imports_a_module_after_the_first",),
               "the end game's distinct phases through np.unique, which imports numpy.ma in the middle of the epoch"),
    CodeMutant("longest_first_unstable", "odb/batching/grouping.py",
               'return np.argsort(-a, kind="stable").tolist()', 'return np.argsort(-a, kind="quicksort").tolist()',
               ("tests/test_batching_policy.py::test_the_longest_first_order_is_the_stable_reversed_sort",),
               "the window's longest-first order breaks ties out of position order (another packing on every rank)"),
    CodeMutant("longest_first_rounds_big_ints", "odb/batching/grouping.py",
               "float(np.abs(a).max()) < 2.0 ** 53", "float(np.abs(a).max()) <= 2.0 ** 53",
               ("tests/test_batching_policy.py::test_the_longest_first_order_is_the_stable_reversed_sort",),
               "ints past 2^53 beside floats sorted as rounded floats (two sizes Python orders tie)"),
    CodeMutant("keys_take_shifted", "odb/batching/deal.py",
               "return list(zip(self.pos[at.start:at.stop], self.idx[at.start:at.stop]))",
               "return list(zip(self.pos[at.start:at.stop], self.idx[at.start + 1:at.stop + 1]))",
               ("tests/test_deal.py::test_a_rank_reads_the_keys_of_its_parts_in_the_order_dealt",),
               "a top-up's keys pair each position with the next position's dataset index"),
    # -- the round's decision over the gathered columns ------------------------------------------------------------
    CodeMutant("step_skips_choice_bounds", "odb/protocol/machine.py", "if v is None or not lo <= v <= hi:",
               "if v is None:",
               ("tests/test_protocol_table.py::test_step_still_checks_a_choice_against_its_contract",
                "tests/test_protocol_table.py::test_choice_outside_its_contract_is_rejected"),
               "a choice outside its contract fires (the runtime's `choose` is no longer checked)"),
    CodeMutant("unbound_leaf_reads_zero", "odb/protocol/expr.py",
               "    if t is None or not (isinstance(t, Lazy) or name in t):\n        raise KeyError",
               "    if t is None or not (isinstance(t, Lazy) or name in t):\n        return 0\n        raise KeyError",
               ("tests/test_protocol_table.py::test_an_unbound_leaf_raises_naming_it",),
               "an unbound name in an expression reads as 0 instead of raising"),
    CodeMutant("and_evaluates_both_sides", "odb/protocol/expr.py", 'return f"bool({a[0]} {op} {a[1]})"',
               """return f"(bool({a[0]}) {'&' if op == 'and' else '|'} bool({a[1]}))\"""",
               ("tests/test_protocol_table.py::test_data_source_is_asked_only_when_a_guard_needs_it",),
               "a conjunction evaluates its right side when its left is false: the source is asked for an "
               "input no guard needs (the table's reads are lazy, left to right)"),
    CodeMutant("generated_ite_swapped", "odb/protocol/expr.py", 'return f"({a[1]} if {a[0]} else {a[2]})"',
               'return f"({a[2]} if {a[0]} else {a[1]})"',
               ("tests/test_protocol_table.py::test_each_table_runs_its_own_rows_in_one_process",
                "tests/test_interpreters_agree.py::test_the_generated_evaluator_reads_and_computes_as_the_tree"),
               "the generated if-then-else takes the other branch"),
    CodeMutant("generated_deep_tree_in_one_text", "odb/protocol/expr.py", "    if depth >= _DEPTH:",
               "    if depth >= 100 * _DEPTH:",
               ("tests/test_interpreters_agree.py::test_a_deep_expression_evaluates_past_the_parsers_nesting_limit",),
               "a deep expression is generated as one text, past the parser's nesting limit"),
    CodeMutant("shape_forgets_constant_types", "odb/protocol/expr.py", "return (Const, type(e.value), e.value)",
               "return (Const, e.value)",
               ("tests/test_interpreters_agree.py::test_a_tree_built_again_reuses_its_function_and_keeps_its_"
                "constants_types",),
               "a tree evaluates with the function of an equal one built before: true reads as 1"),
    CodeMutant("guards_compiled_once_for_every_table", "odb/protocol/machine.py",
               'cache = table.__dict__.setdefault("_guards", {})', 'cache = _guards.__dict__.setdefault("_guards", {})',
               ("tests/test_protocol_table.py::test_each_table_runs_its_own_rows_in_one_process",),
               "the guards are compiled once per process: a table mutant runs the first table's guards"),
    CodeMutant("updates_compiled_once_for_every_table", "odb/protocol/machine.py",
               'cache = table.__dict__.setdefault("_row_values", {})',
               'cache = _row_values.__dict__.setdefault("_row_values", {})',
               ("tests/test_protocol_table.py::test_each_table_runs_its_own_rows_in_one_process",),
               "the updates are compiled once per process: a table mutant runs the first table's updates"),
    CodeMutant("bounds_compiled_once_for_every_table", "odb/protocol/machine.py",
               'cache = table.__dict__.setdefault("_bounds", {})', 'cache = _bounds.__dict__.setdefault("_bounds", {})',
               ("tests/test_protocol_table.py::test_each_table_runs_its_own_rows_in_one_process",),
               "the choice bounds are compiled once per process: a table mutant checks the first table's contract"),
    CodeMutant("table_pickles_its_caches", "odb/protocol/table.py",
               "return {f.name: getattr(self, f.name) for f in dataclass_fields(self)}", "return dict(self.__dict__)",
               ("tests/test_protocol_table.py::test_a_table_used_by_the_interpreter_still_pickles",),
               "a table pickles what the interpreter cached beside its fields: a table that has run cannot be pickled"),
    CodeMutant("payload_shifted", "odb/protocol/machine.py", "payload = dict(zip(posted, v[k:]))",
               "payload = dict(zip(posted, v[k + 1:]))",
               ("tests/test_protocol_table.py::test_data_source_is_asked_only_when_a_guard_needs_it",),
               "a post's header is read one value late (its first field gets the second's value)"),
    CodeMutant("inputs_read_again", "odb/protocol/machine.py", "        self[k] = v\n        return v",
               "        return v",
               ("tests/test_protocol_table.py::test_data_source_is_asked_only_when_a_guard_needs_it",),
               "an input is requested from the environment each time a guard reads it, not once a step "
               "(a source asked twice for one sample)"),
    CodeMutant("columns_past_the_exact_range", "odb/protocol/machine.py",
               "if int(col.max()) > _COLUMN_LIMIT or int(col.min()) < -_COLUMN_LIMIT:", "if False:",
               ("tests/test_interpreters_agree.py::test_aggregates_over_header_columns_equal_the_interpreter_per_header",),
               "header columns past int64's exact sums are aggregated as arrays (a sum wraps where the table's ints do not)"),
    CodeMutant("array_ite_swapped", "odb/protocol/machine.py",
               "np.where(x(c, cfg), t(c, cfg), f(c, cfg))", "np.where(x(c, cfg), f(c, cfg), t(c, cfg))",
               ("tests/test_interpreters_agree.py::test_aggregates_over_header_columns_equal_the_interpreter_per_header",),
               "the array form of an if-then-else takes the other branch"),
    CodeMutant("agree_fast_path_skips_the_epoch", "odb/core/replica.py",
               "(a[:, at[1:]] == a[0, at[1:]]).all()", "(a[:, at[2:]] == a[0, at[2:]]).all()",
               (R + "test_ranks_on_different_epochs_all_get_a_config_error_before_any_batch",),
               "the replicated-field check's one pass leaves the epoch out (ranks on different epochs go on)"),
    CodeMutant("partition_check_misses_a_repeat", "odb/batching/base.py",
               "    if not (all(groups) and len(set(flat)) == len(flat) and", "    if not (all(groups) and",
               ("tests/test_batching_policy.py::test_the_partition_check_refuses_every_broken_partition_and_names_the_fault",),
               "the partition check lets a position given to two groups through"),
    CodeMutant("cost_without_a_resource_raises", "odb/batching/cost.py",
               "            except IndexError:  # a sample without it", "            except KeyError:  # a sample without it",
               ("tests/test_batching_cost.py::test_a_resource_costs_its_definition_when_some_samples_lack_it",),
               "a sample without a budgeted resource (text in a multimodal batch) raises instead of costing none of it"),
    # -- the conformance checker -----------------------------------------------------------------------------------
    CodeMutant("checker_skips_replicated", "proofs/conformance/check.py",
               "            if len(set(vals)) > 1:\n                rep.problems.append(f\"round {rnd}: ranks posted different",
               "            if False:\n                rep.problems.append(f\"round {rnd}: ranks posted different",
               (C + "test_a_tampered_trace_is_rejected[tamper_replicated]",),
               "the checker does not compare the replicated fields across ranks"),
    CodeMutant("checker_skips_happens_before", "proofs/conformance/check.py",
               "rep.problems += hb.problems", "rep.problems += []",
               ("tests/test_graphs.py::test_a_trace_that_reorders_two_collectives_on_one_rank_is_rejected_naming_the_rank_and_the_rounds",),
               "the checker builds the happens-before graph but ignores what it finds"),
    # -- the simulation is the runtime's core ------------------------------------------------------------------
    CodeMutant("sim_lead_differs", "odb/core/sim.py", "first_lead(self.layout.window, self.aheads)",
               "first_lead(self.layout.window + 1, self.aheads)",
               ("tests/test_differential.py::test_the_loader_on_gloo_ranks_emits_the_simulations_batches[dealt-pad-8-2]",),
               "the simulation deals its first window with another lead than the runtime"),
    CodeMutant("checker_skips_summaries", "proofs/conformance/check.py",
               'if coll["summaries"] != summaries:', "if False:",
               (C + "test_a_tampered_trace_is_rejected[tamper_summary]",),
               "the checker does not compare received summaries with posted ones"),
    # -- what the loader reports -------------------------------------------------------------------------------
    CodeMutant("straggler_from_own_tokens", "odb/core/rank.py",
               "t_max += tokens_max[k]",
               "t_max += loc[0]",
               ("tests/test_observe.py::test_token_balance_is_the_gathered_straggler_estimate",),
               "the straggler estimate reads this rank's tokens instead of the gathered largest rank's"),
    CodeMutant("padding_ratio_inverted", "odb/core/info.py",
               "1.0 - self.real_tokens / self.padded_tokens", "self.real_tokens / self.padded_tokens",
               ("tests/test_observe.py::test_the_pass_summary_is_logged_with_figures_recomputed_from_the_batches",),
               "the padding ratio reports the real share instead of the padding share"),
    # -- the policy's fast paths at many ranks -----------------------------------------------------------------
    CodeMutant("profile_lends_from_every_bucket", "odb/batching/policy.py",
               "h = h - np.clip(lend[:, None] - before, 0, h)", "h = h - np.clip(lend[:, None], 0, h)",
               ("tests/test_batching_policy.py::test_the_profile_counts_each_ranks_groups_after_those_it_lends",),
               "a rank lending groups to over-budget slots loses them from every bucket, not from its fullest ones"),
    CodeMutant("array_live_keeps_empty_ranks", "odb/batching/policy.py",
               "live = a if has.all() else a[has]", "live = a",
               ("tests/test_batching_policy.py::test_ranks_without_data_do_not_bind_the_target",),
               "the ranks with an empty window count in the minima (a target of 1 whenever one rank has no data)"),
    CodeMutant("array_memo_trusts_any_array", "odb/batching/policy.py",
               "    if isinstance(summaries, np.ndarray) or isinstance(key, np.ndarray):\n        return False",
               "    if isinstance(summaries, np.ndarray) or isinstance(key, np.ndarray):\n        return True",
               ("tests/test_batching_policy.py::test_the_summaries_as_one_array_decide_as_rows_do_round_after_round",),
               "the policy's memo answers a new round's summaries array with the last round's decision"),
    CodeMutant("profile_memo_uncut", "odb/batching/policy.py", "        return prof[:target]\n", "        return prof\n",
               ("tests/test_batching_policy.py::test_many_ranks_decide_as_few_do",),
               "the profile memo answers a short target with the longer profile it holds"),
    CodeMutant("over_budget_scan_misses_a_level", "odb/batching/policy.py",
               "        if over.any():  # some rank holds", "        if over[:, :OVER - 1].any():  # some rank holds",
               ("tests/test_batching_policy.py::test_an_over_budget_slot_opens_at_every_level",),
               "the fast check for over-budget samples misses the cheapest over-budget level"),
    # -- the attention-aware fill (rule 0) ---------------------------------------------------------------------
    CodeMutant("fill_ignores_attention", "odb/batching/policy.py",
               "g = aligned_fill(pack(window, cost, moments), window, cost, self.attention, moments)", "g = pack(window, cost)",
               ("tests/test_batching_policy.py::test_matched_slots_come_from_the_profile_buckets_in_decreasing_cost",
                "tests/test_batching_policy.py::test_a_padded_window_past_64_samples_packs_and_orders_in_arrays_exactly_as_sample_by_sample"),
               "the policy buckets and orders groups by the plain budget fill although attention is set"),
    CodeMutant("padded_weight_without_padding", "odb/batching/policy.py",
               "(1.0 + a * g.fill * B / len(g.positions))", "(1.0 + a * g.fill * B)",
               ("tests/test_batching_policy.py::test_the_attention_term_weighs_one_long_sample_above_many_short_ones_of_the_same_tokens",),
               "the padded weight takes the group's padded tokens for its longest sample"),
    CodeMutant("attention_unchecked", "odb/batching/policy.py",
               "or not 0 <= attention < float(\"inf\"):", "or False:",
               ("tests/test_batching_policy.py::test_attention_must_be_a_finite_number_at_least_zero",),
               "a negative or non-finite attention is accepted"),
    CodeMutant("fill_rounds_past_the_budget", "odb/batching/policy.py",
               "return aligned if plain > 1.0 else min(aligned, plain)", "return aligned",
               ("tests/test_batching_policy.py::test_a_sample_of_exactly_the_budget_stays_within_it_under_the_attention_aware_fill",),
               "the attention-aware fill of a group of exactly the budget may round past 1 (taken for over budget)"),
    CodeMutant("moments_miss_the_short_end", "odb/batching/grouping.py",
               "tot += v\n                sq += v * v\n                j -= 1", "tot += v\n                j -= 1",
               ("tests/test_batching_policy.py::test_the_attention_aware_fill_keeps_the_budget_line",),
               "the packing pass's sums of squares leave out the samples topped up from the short end"),
    # -- the epoch's last round (rules 1 and 5) ----------------------------------------------------------------
    CodeMutant("last_round_at_the_least_count", "odb/batching/policy.py",
               "return max(1, int(live[:, 4].max()))", "return max(1, int(live[:, 4].min()))",
               ("tests/test_batching_policy.py::test_the_epochs_last_round_flushes_every_window_in_one_round_without_fillers",
                "tests/test_batching_sim.py::test_odb_beats_the_release_algorithm_on_its_long_tail_mix"),
               "the epoch's last round flushes at the least count of groups: a tail of rounds, fillers on most ranks"),
    CodeMutant("split_the_group_with_most_samples", "odb/batching/policy.py",
               "heap = [(-g.fill, -len(g.positions), k,", "heap = [(-len(g.positions), -g.fill, k,",
               ("tests/test_batching_policy.py::test_extra_batches_split_the_costliest_group_not_the_one_with_most_samples",),
               "extra batches split the group with the most samples, not the costliest one"),
    CodeMutant("split_a_lone_sample", "odb/batching/policy.py", "if len(g) == 1:  # a lone sample", "if not g:  # a lone sample",
               ("tests/test_batching_policy.py::test_partition_keeps_the_contract_for_any_real",),
               "a lone sample is split into itself and an empty batch"),
    # -- the partition's window orders, computed before the collective (docs/decisions/2026-12-03-decision-window-work.md)
    CodeMutant("end_game_rest_by_position", "odb/batching/policy.py", "rest.sort(key=place.__getitem__)", "rest.sort()",
               ("tests/test_batching_policy.py::test_at_the_epoch_end_the_open_slots_take_the_costliest_groups_first",),
               "at the epoch end the open slots take groups in window order, not costliest first"),
    CodeMutant("slots_in_profile_order", "odb/batching/policy.py",
               "return sorted(taken, key=place.__getitem__)  # decreasing fill", "return taken  # decreasing fill",
               ("tests/test_batching_policy.py::test_matched_slots_come_from_the_profile_buckets_in_decreasing_cost",),
               "the picked groups go out in the profile's order, not in decreasing fill"),
    CodeMutant("one_group_per_bucket_run", "odb/batching/policy.py", "got = bb[b][h:h + len(list(run))]",
               "got = bb[b][h:h + 1]",
               ("tests/test_batching_policy.py::test_matched_slots_come_from_the_profile_buckets_in_decreasing_cost",),
               "a run of the profile's slots of one bucket takes one group of it, the rest left to the open slots"),
    CodeMutant("bucket_head_not_advanced", "odb/batching/policy.py", "head[b] = h + len(got)", "head[b] = h",
               ("tests/test_batching_policy.py::test_the_open_slots_after_the_profile_take_only_groups_the_profile_left",),
               "a bucket's taken groups are handed out again to the open slots (a position in two batches)"),
    CodeMutant("policy_handed_the_kept_sizes", "odb/core/rank.py", "        sizes = self._sized.copy()",
               "        sizes = self._sized",
               ("tests/test_batching_sim.py::test_a_policy_that_sorts_the_window_it_is_handed_changes_no_batch",),
               "the policy's summarize is handed the list the partition reads: a policy reordering it moves the batches"),
    CodeMutant("loader_figure_drops_the_summaries", "paper_repro/bench_runtime.py",
               "return self._timed(super().partition, window, target, real, cost, summaries=summaries)",
               "return self._timed(super().partition, window, target, real, cost)",
               ("tests/test_bench_runtime.py::test_the_loader_figures_timed_policy_emits_the_default_policys_batches",),
               "the loader benchmark's timed policy partitions without the gathered summaries (a sibling's path)"),
    CodeMutant("decision_explain_rest_keeps_the_plan", "paper_repro/bench_runtime.py",
               'rest = d["decision"]["median_ms"] - d["replicated"]["median_ms"] - d["plan"]["median_ms"]',
               'rest = d["decision"]["median_ms"] - d["replicated"]["median_ms"]',
               ("tests/test_bench_runtime.py::test_a_missed_decision_target_is_explained_by_the_rounds_and_the_parts_"
                "that_take_the_time",),
               "a missed decision's explanation counts the plan twice: in its own part and in the rest"),
    CodeMutant("decision_floor_without_the_plan", "paper_repro/bench_runtime.py",
               'grows = d["replicated"]["median_ms"] + d["plan"]["median_ms"]', 'grows = d["replicated"]["median_ms"]',
               ("tests/test_bench_runtime.py::test_a_missed_decision_target_is_explained_by_the_rounds_and_the_parts_"
                "that_take_the_time",),
               "the decision's floor leaves the plan out: a miss the plan alone explains is reported as room to spare"),
    CodeMutant("exchange_plan_time_not_counted", "odb/core/rank.py",
               "        self.stats.exchange_plan_s += time.perf_counter() - t0\n", "",
               ("tests/test_bench_decision.py::test_an_exchanging_rank_replayed_alone_receives_what_the_simulation_"
                "moved_and_posts_what_it_posted",),
               "the exchange's plan is not timed: the decision benchmark cannot say where its time goes"),
    # -- pooled windows (odb.core.pool) --------------------------------------------------------------------------
    CodeMutant("pool_ignores_a_lanes_stop", "odb/core/pool.py", 'st = a[:, :, rows.layout.index["st"]].max(axis=1)', 'st = a[:, 0, rows.layout.index["st"]]',
               (P + "test_pool_rows_take_lane_zero_with_the_largest_status_of_the_pool",),
               "a pool's row takes lane 0's status: another lane that stops is not seen"),
    CodeMutant("pool_view_keeps_lane_zeros_status", "odb/core/pool.py", "if (a[:, 0, at] == st).all():",
               "if True:", (P + "test_pool_rows_take_lane_zero_with_the_largest_status_of_the_pool",),
               "a pool's row is lane 0's header as it is, also when another lane stops (its status is lost)"),
    CodeMutant("pool_lane_one_unchecked", "odb/core/pool.py", "if (b[:, 1:] != b[:, :1]).any():", "if (b[:, 2:] != b[:, :1]).any():",
               (P + "test_pool_rows_refuse_lanes_that_posted_other_headers",),
               "a pool's second rank is never compared with its first (a pool of 2 never diverges)"),
    CodeMutant("pool_stopping_pools_compared", "odb/core/pool.py", "b = read if live.all() else read[live]", "b = read",
               (P + "test_pool_rows_take_lane_zero_with_the_largest_status_of_the_pool",
                P + "test_pool_rows_name_the_diverged_rank_behind_a_stopping_pool"),
               "a stopping pool's lanes are compared too: its stop is reported as a divergence"),
    CodeMutant("pool_fault_index_unmapped", "odb/core/pool.py", "p, j = int(np.flatnonzero(live)[p[0]]), int(j[0])",
               "p, j = int(p[0]), int(j[0])",
               (P + "test_pool_rows_name_the_diverged_rank_behind_a_stopping_pool",),
               "behind a stopping pool, the error names a rank of the wrong pool"),
    CodeMutant("pool_lanes_never_compared", "odb/core/pool.py", "    if live.any():  # a pool none", "    if False:  # a pool none",
               (P + "test_pool_rows_refuse_lanes_that_posted_other_headers",
                P + "test_pooled_ranks_that_measure_a_sample_otherwise_stop_every_rank_loudly"),
               "lanes that posted other headers are not compared: diverged replicas go on"),
    CodeMutant("pool_read_fills_uncompared", "odb/core/pool.py",
               "a[:, :, :rows.layout._fills + fills_read]",
               "a[:, :, :rows.layout._fills]",
               (P + "test_with_the_exchange_pool_rows_compare_the_fills_the_plan_reads_and_no_others",),
               "with the exchange no fill is compared: a lane whose batches differ plans from lane 0's fills"),
    CodeMutant("pool_last_read_fill_uncompared", "odb/core/pool.py",
               "a[:, :, :rows.layout._fills + fills_read]",
               "a[:, :, :rows.layout._fills + fills_read - 1]",
               (P + "test_with_the_exchange_pool_rows_compare_the_fills_the_plan_reads_and_no_others",),
               "the last fill the plan reads is not compared across a pool's lanes"),
    CodeMutant("every_lane_takes_lane_zeros_batches", "odb/core/rank.py", "mine = held[j::self.lanes]",
               "mine = held[0::self.lanes]",
               (P + "test_one_core_per_pool_emits_what_every_rank_replica_emits",
                P + "test_the_pooled_loader_emits_the_simulations_batches_with_global_counts"),
               "every lane releases lane 0's batches: samples repeat and are lost"),
    CodeMutant("lane_posts_every_batchs_counts", "odb/core/rank.py",
               "elif lane == self.lane:  # this lane's own batches", "elif True:  # this lane's own batches",
               (P + "test_the_pooled_loader_emits_the_simulations_batches_with_global_counts",),
               "a lane posts the counts of its pool's other lanes' batches: wrong global counts"),
    CodeMutant("pool_proposal_not_rounded", "odb/core/replica.py", "proposal = lane_proposal(proposal, lanes, hi)",
               "proposal = proposal", (P + "test_one_core_per_pool_emits_what_every_rank_replica_emits",),
               "the pools' target is not a multiple of the pool size: a filler on some lanes every round"),
    CodeMutant("pool_over_slots_of_any_count", "odb/batching/policy.py", "n -= n % lanes", "n -= 0",
               (P + "test_a_pools_over_budget_slots_come_in_multiples_of_its_ranks_so_a_step_holds_one_level",),
               "a pool's over-budget slots are not a multiple of its ranks: a step mixes over-budget levels"),
    CodeMutant("pool_prefetch_unchecked", "odb/runtime/loader.py",
               "check_pool(self.world_size, s.pool_size, s.mode, self.sharding, self._aheads)",
               "check_pool(self.world_size, s.pool_size, s.mode, self.sharding)",
               (P + "test_lanes_that_read_ahead_otherwise_are_refused_on_every_rank",),
               "lanes that read ahead otherwise are not refused (they diverge once a sample is dropped)"),
    # -- the targets' tally over every committed grid (paper_repro.scale_targets) -----------------------------------
    CodeMutant("tally_overlap_unchecked", "paper_repro/scale_targets.py",
               "if m in have[\"methods\"] and without_timings(have[\"methods\"][m]) != without_timings(v):",
               "if False:",
               ("tests/test_scale_targets.py::test_merge_keeps_a_point_once_unites_its_methods_and_refuses_files_that_disagree",),
               "two result files give one point different figures and the tally counts whichever came first"),
    CodeMutant("tally_counts_stale_files", "paper_repro/scale_targets.py", 'if status[p.name][0] == "STALE":',
               'if status[p.name][0] == "none":',
               ("tests/test_scale_targets.py::test_the_tally_leaves_stale_files_out_and_names_every_file",),
               "a result from code that computes otherwise now is counted in the README's tally"),
    CodeMutant("tally_ties_count_as_wins", "paper_repro/scale_targets.py",
               'and r["methods"][b]["predicted"]["samples_per_s"] >= x["predicted"]["samples_per_s"])',
               'and r["methods"][b]["predicted"]["samples_per_s"] > x["predicted"]["samples_per_s"])',
               ("tests/test_scale_targets.py::test_the_per_window_lines_count_each_windows_misses_and_losses",),
               "a peer as fast as ODB counts as beaten (the target is to be faster)"),
    # -- the epoch end's figures (`paper_repro.epoch_end`) ---------------------------------------------------------
    CodeMutant("epoch_end_joint_is_per_round", "paper_repro/epoch_end.py",
               '"joint": float(base / (base + flowing + R.max() - R.mean()))}',
               '"joint": float(base / (base + flowing + per_round))}',
               ("tests/test_epoch_end.py::test_joint_bound_levels_across_end_rounds",),
               "the joint bound is the per-round one (the end's rounds never level each other)"),
    CodeMutant("epoch_end_starts_a_round_late", "paper_repro/epoch_end.py", "    end = rnd >= end_round\n",
               "    end = rnd > end_round\n", ("tests/test_epoch_end.py::test_split_loss_by_hand",),
               "the first round with a dry rank is counted as flowing"),
    CodeMutant("equal_groups_bound_by_the_sum", "paper_repro/epoch_end.py",
               "lo, hi = max(w) * (1 - 1e-12), len(w) * max(w) + 1.0",
               "lo, hi = max(w) * (1 - 1e-12), sum(w) + 1.0",
               ("tests/test_epoch_end.py::test_equal_groups_cut_every_sample_once_within_budget",),
               "the re-cut's bisection starts below a run the budget allows (a pair that fits is cut apart)"),
    CodeMutant("flow_prototype_inert", "paper_repro/epoch_end.py", "            if ex.any() and not ex.all():\n",
               "            if False:\n",
               ("tests/test_epoch_end.py::test_flow_prototype_decides_the_rounds_some_rank_ran_dry",),
               "the flow-until-all prototype decides every round as the default does"),
    # -- the policy's numpy paths past 64 groups (docs/decisions/2026-12-04-runtime-figures-history.md) -------------
    CodeMutant("window_buckets_floor", "odb/batching/policy.py", "-np.rint(t).astype(np.int64)",
               "-np.floor(t).astype(np.int64)",
               ("tests/test_batching_policy.py::test_the_window_buckets_its_groups_as_fill_bucket_does_one_by_one",),
               "a long window's buckets truncate the thousandths instead of rounding them half to even"),
    CodeMutant("window_buckets_left_edge", "odb/batching/policy.py", 'np.searchsorted(_NEG_LOWER_A, -np.rint(t).astype(np.int64), side="right")',
               'np.searchsorted(_NEG_LOWER_A, -np.rint(t).astype(np.int64), side="left")',
               ("tests/test_batching_policy.py::test_the_window_buckets_its_groups_as_fill_bucket_does_one_by_one",),
               "a long window's group on a bucket's edge goes to the next bucket"),
    CodeMutant("window_buckets_nan_unchecked", "odb/batching/policy.py", "    if np.abs(t).max() < 1e18:  # False for NaN\n",
               "    if True:\n",
               ("tests/test_batching_policy.py::test_a_fill_that_is_not_finite_raises_in_a_long_window_as_in_a_short_one",),
               "a long window's NaN or infinite fill is bucketed silently instead of raising"),
    CodeMutant("many_groups_clamp_swapped", "odb/batching/policy.py", "return np.where(f > 1.0, al, np.minimum(al, f))",
               "return np.where(f > 1.0, np.minimum(al, f), al)",
               ("tests/test_batching_policy.py::test_the_attention_aware_fill_of_many_groups_is_the_fill_of_each",),
               "past 64 groups a lone over-budget sample's fill is clamped to its plain fill, and a group within budget not"),
    CodeMutant("many_groups_fill_reordered", "odb/batching/policy.py", "al = f * (1.0 + a * f * B / n) * (1.0 / (1.0 + a * B))",
               "al = f * (1.0 + a * f * (B / n)) * (1.0 / (1.0 + a * B))",
               ("tests/test_batching_policy.py::test_the_attention_aware_fill_of_many_groups_is_the_fill_of_each",),
               "past 64 groups the fill's float operations run in another order (other last bits than group by group)"),
    CodeMutant("fullest_first_ties_reversed", "odb/batching/policy.py",
               "by_fill = sorted(range(len(closed)), key=fills.__getitem__, reverse=True)",
               "by_fill = sorted(range(len(closed)), key=lambda k: (fills[k], k), reverse=True)",
               ("tests/test_batching_policy.py::test_the_fullest_first_order_breaks_ties_by_the_groups_order",),
               "groups of equal fill go out in reverse order (the replicas agree, but the order is not the stated one)"),
    # -- the padded window packed in arrays (policy._padded_window) ----------------------------------------------
    CodeMutant("array_pack_density_reads_open_group", "odb/batching/policy.py",
               "density = np.add.reduceat(tok[order[:end]], st[:m])", "density = np.add.reduceat(tok[order], st[:m])",
               ("tests/test_batching_policy.py::test_a_padded_window_past_64_samples_packs_and_orders_in_arrays_exactly_as_sample_by_sample",
                "tests/test_batching_policy.py::test_the_array_packing_agrees_at_the_window_edges"),
               "the last closed group's real tokens count the open group's too (its place in its bucket moves)"),
    CodeMutant("array_pack_last_group_closed", "odb/batching/policy.py",
               "closed[-1] = len(pos[-1]) == int(cap[starts[-1]])", "closed[-1] = True",
               ("tests/test_batching_policy.py::test_a_padded_window_past_64_samples_packs_and_orders_in_arrays_exactly_as_sample_by_sample",
                "tests/test_batching_policy.py::test_the_array_packing_agrees_at_the_window_edges"),
               "the window's last group is closed even where another sample would still fit it"),
    CodeMutant("array_pack_ties_reversed", "odb/batching/policy.py",
               'by_fill = np.argsort(-cf, kind="stable")', 'by_fill = np.argsort(cf, kind="stable")[::-1]',
               ("tests/test_batching_policy.py::test_a_padded_window_past_64_samples_packs_and_orders_in_arrays_exactly_as_sample_by_sample",
                "tests/test_batching_policy.py::test_the_array_packing_agrees_at_the_window_edges"),
               "groups of equal fill leave in reverse order on the array path only"),
    CodeMutant("array_pack_fill_reordered", "odb/batching/policy.py",
               "f = (cnt * top_a) / B", "f = cnt * (top_a / B)",
               ("tests/test_batching_policy.py::test_a_padded_window_past_64_samples_packs_and_orders_in_arrays_exactly_as_sample_by_sample",
                "tests/test_batching_policy.py::test_the_array_packing_agrees_at_the_window_edges"),
               "the plain fill's float operations run in another order (other last bits than `pack`'s)"),
    CodeMutant("array_pack_tokens_of_resource", "odb/batching/policy.py",
               "tok = lens if r.index == 0 else np.array(list(map(itemgetter(0), window)))", "tok = lens",
               ("tests/test_batching_policy.py::test_a_padded_window_past_64_samples_packs_and_orders_in_arrays_exactly_as_sample_by_sample",
                "tests/test_batching_policy.py::test_the_array_packing_agrees_at_the_window_edges"),
               "the density reads the budgeted resource, not the tokens, when the resource is not the first entry"),
    CodeMutant("array_pack_ignores_attention", "odb/batching/policy.py",
               "    if attention:  # `aligned_fill`'s padded rule\n", "    if False:\n",
               ("tests/test_batching_policy.py::test_matched_slots_come_from_the_profile_buckets_in_decreasing_cost",),
               "a long padded window's groups are bucketed and ordered by the plain fill although attention is set"),
    CodeMutant("array_pack_budget_rounded", "odb/batching/policy.py",
               "int(B) // np.maximum(ls, 1)", "round(B) // np.maximum(ls, 1)",
               ("tests/test_batching_policy.py::test_a_padded_window_past_64_samples_packs_and_orders_in_arrays_exactly_as_sample_by_sample",
                "tests/test_batching_policy.py::test_the_array_packing_agrees_at_the_window_edges",
                "tests/test_batching_policy.py::test_a_fractional_budget_caps_a_group_at_its_floor_on_both_paths"),
               "a fractional budget rounds up in the caps: a group takes one sample more than fits"),
    # -- visual_stub: the vision tower on every rank (odb.batching.collate) --------------------------------------
    CodeMutant("stub_never_appended", "odb/batching/collate.py",
               "return collate_fn([*batch, *extra] if extra else batch)", "return collate_fn(batch)",
               (V + "test_a_stub_runs_the_vision_tower_on_a_text_only_batch_and_changes_no_loss_or_gradient",
                "tests/test_vlm_fsdp.py::test_a_text_only_rank_runs_the_sharded_vision_tower_with_a_stub_and_trains_exactly",
                "tests/test_vlm_fsdp.py::test_through_the_loader_text_only_batches_and_fillers_run_the_sharded_tower"),
               "a text-only batch goes without the stub: under FSDP the ranks' collectives no longer match"),
    CodeMutant("stub_always_appended", "odb/batching/collate.py",
               "extra = [s for keys, s in need if not all(any(key in b for b in batch) for key in keys)]",
               "extra = [s for keys, s in need]",
               (V + "test_a_stub_is_added_only_where_the_batch_lacks_its_kind_and_keeps_the_collates_label_rule",),
               "the stub is appended to batches that already run the tower (extra cost, outside the budget)"),
    CodeMutant("stub_labels_unchecked", "odb/batching/collate.py",
               "        if bool((lab != IGNORE_INDEX).any()):\n", "        if False:\n",
               (V + "test_a_stub_that_would_train_or_would_not_run_the_tower_is_refused",),
               "a stub with label tokens is accepted: it would add to the loss without being counted"),
    CodeMutant("stub_hides_packing", "odb/batching/collate.py",
               "    collate.packs = counts_shifted(collate_fn)\n", "    collate.packs = False\n",
               (V + "test_a_stub_is_added_only_where_the_batch_lacks_its_kind_and_keeps_the_collates_label_rule",),
               "a stubbed packing collate is taken for a padding one: the loader counts one label per sample too many"),
    # -- the round exchange in the rank core (odb.core.rank; the simulation drives it) ---------------------------
    CodeMutant("core_exchange_counts_as_formed", "odb/core/rank.py",
               "                self._fills[k] = batch_key([it.sizes for it in taken], self.cost, self._attention, "
               "self._slack)\n            return\n",
               "                self._fills[k] = batch_key([it.sizes for it in taken], self.cost, self._attention, "
               "self._slack)\n",
               (X + "test_after_the_exchange_every_step_has_its_global_counts_and_every_sample_runs_once",),
               "a batch's counts are posted where it was formed as well as where it runs: every step's global "
               "counts, and so every loss scale, are wrong"),
    CodeMutant("core_exchange_placed_counts_dropped", "odb/core/rank.py",
               "            for m, b in self._placed:  # the placed round's",
               "            for m, b in ():  # the placed round's",
               (X + "test_after_the_exchange_every_step_has_its_global_counts_and_every_sample_runs_once",),
               "the placed batches' counts are not posted: the steps' global counts are 0, every loss scale too"),
    CodeMutant("core_exchange_keeps_nothing", "odb/core/rank.py", "            if q in home:\n",
               "            if False:\n",
               (X + "test_the_rank_core_exchanges_every_round_as_the_plan_says",),
               "a batch that stays in its pool is sent to itself or its pool: the delivery does not match the plan"),
    CodeMutant("core_exchange_sends_inside_the_pool", "odb/core/rank.py", "            if q in home:\n",
               "            if q in own:\n",
               (X + "test_a_batch_that_moves_inside_its_pool_moves_in_memory_and_only_batches_leaving_it_are_sent",),
               "a replica sends the batches that move between its pool's ranks, which every replica of the pool "
               "holds already: the receiving lane does not expect them"),
    CodeMutant("core_exchange_plans_the_last_round", "odb/core/rank.py", "        if not final:\n            self._plan()",
               "        if True:\n            self._plan()",
               (X + "test_after_the_exchange_every_step_has_its_global_counts_and_every_sample_runs_once",),
               "the pass's last round is planned instead of released: its batches are lost"),
    CodeMutant("core_exchange_plan_from_own_fills", "odb/core/rank.py",
               "plan = plan_origins(rank_fill_array(self._rows.fills, G, T), self._slack)",
               "plan = plan_origins(rank_fill_array(self._rows.fills[[self.rank // G if self.lane is not None "
               "else self.rank] * len(self._rows)], G, T), self._slack)",
               (X + "test_the_rank_core_exchanges_every_round_as_the_plan_says",),
               "a rank-local input in the replicated plan: each rank plans as if every pool had formed its own "
               "batches, so the ranks' plans differ and the deliveries no longer match (must fail loudly)"),
    CodeMutant("core_exchange_lane_unset", "odb/core/rank.py", "                b.lane = j\n                placed",
               "                placed",
               (X + "test_the_rank_core_exchanges_every_round_as_the_plan_says",),
               "a placed batch keeps its old lane: a pool's one core releases it on another rank's row"),
    CodeMutant("core_exchange_plain_fill", "odb/core/rank.py",
               'self._attention = float(getattr(policy, "attention", 0.0) or 0.0) if self.exchange else 0.0',
               "self._attention = 0.0",
               (X + "test_the_rank_core_exchanges_every_round_as_the_plan_says",),
               "the posted fills ignore the policy's attention: the plan lines up budget cost, not step time"),
    CodeMutant("core_exchange_slack_dropped", "odb/core/rank.py",
               "plan = plan_origins(rank_fill_array(self._rows.fills, G, T), self._slack)",
               "plan = plan_origins(rank_fill_array(self._rows.fills, G, T))",
               (X + "test_the_rank_core_exchanges_every_round_as_the_plan_says",),
               "the core posts budget-balance keys but plans without the slack: budget cost is never balanced"),
    # -- budget balance in the plan (odb.batching.exchange) --------------------------------------------------------
    CodeMutant("exchange_ties_unstable", "odb/batching/exchange.py",
               'idx = np.argsort((key & 0xFFFF).astype(np.uint16), kind="stable")',
               'idx = np.argsort((key & 0xFFFF).astype(np.uint16), kind="quicksort")',
               (X + "test_every_round_keeps_every_rule",),
               "equal fills in no fixed order: rule 1 is no longer total by origin, so two builds of numpy could plan "
               "the same round differently"),
    CodeMutant("exchange_movers_reversed", "odb/batching/exchange.py",
               "nth = np.arange(len(go)) - np.searchsorted(go, go)",
               'nth = np.searchsorted(go, go, side="right") - 1 - np.arange(len(go))',
               (X + "test_a_hand_worked_round_moves_only_the_batches_whose_rank_is_taken_in_their_step",
                X + "test_every_round_keeps_every_rule"),
               "a step's moving batches go to its free ranks in reverse: a valid plan, not the documented one"),
    CodeMutant("exchange_balance_budget_ascending", "odb/batching/exchange.py",
               "_stable_order((KEY_SHIFT - 1) - (keys & (KEY_SHIFT - 1)))", "_stable_order(keys & (KEY_SHIFT - 1))",
               (X + "test_a_hand_worked_round_is_budget_balanced_only_when_the_slack_pays_for_it",
                X + "test_a_budget_balanced_round_re_sorts_the_cheapest_blocks_within_its_slack"),
               "a block is re-sorted by increasing budget fill: the plan differs from the documented one on every rank "
               "alike (balance is the same by symmetry, but the rule is not the one proved against the checker)"),
    CodeMutant("exchange_balance_smallest_block", "odb/batching/exchange.py",
               "    for K in range(MAX_BLOCK, 1, -1):\n        cand", "    for K in range(2, MAX_BLOCK + 1):\n        cand",
               (X + "test_a_hand_worked_round_re_sorts_the_cheapest_blocks_within_its_slack",
                X + "test_a_budget_balanced_round_re_sorts_the_cheapest_blocks_within_its_slack"),
               "the smallest blocks are re-sorted first: less budget balance than the slack pays for"),
    CodeMutant("exchange_balance_in_order_not_cheapest", "odb/batching/exchange.py",
               "for b in free[np.argsort(extra[free], kind=\"stable\")].tolist():", "for b in free.tolist():",
               (X + "test_a_hand_worked_round_re_sorts_the_cheapest_blocks_within_its_slack",
                X + "test_a_budget_balanced_round_re_sorts_the_cheapest_blocks_within_its_slack"),
               "the blocks are re-sorted in order, not the cheapest first: the slack buys less balance"),
    CodeMutant("exchange_balance_ignores_the_slack", "odb/batching/exchange.py",
               "room = slack * int(base.sum())", "room = 10 ** 30",
               (X + "test_a_hand_worked_round_is_budget_balanced_only_when_the_slack_pays_for_it",
                X + "test_a_budget_balanced_round_re_sorts_the_cheapest_blocks_within_its_slack"),
               "every block is re-sorted whatever it costs in step time: throughput is spent without bound"),
    CodeMutant("exchange_balance_slack_not_spent", "odb/batching/exchange.py", "            room -= cost\n", "",
               (X + "test_a_hand_worked_round_re_sorts_the_cheapest_blocks_within_its_slack",
                X + "test_a_budget_balanced_round_re_sorts_the_cheapest_blocks_within_its_slack"),
               "each block is held to the whole slack, not to what the blocks before it left: a round spends more"),
    CodeMutant("exchange_balance_blocks_overlap", "odb/batching/exchange.py",
               "            taken[b * K:(b + 1) * K] = True\n", "",
               (X + "test_a_hand_worked_round_re_sorts_the_cheapest_blocks_within_its_slack",
                X + "test_a_budget_balanced_round_re_sorts_the_cheapest_blocks_within_its_slack"),
               "a smaller block re-sorts steps a larger one already did, undoing its balance"),
    CodeMutant("exchange_balance_last_single_step", "odb/batching/exchange.py",
               "        if steps % K == 1:", "        if False:",
               (X + "test_a_hand_worked_round_re_sorts_the_cheapest_blocks_within_its_slack",
                X + "test_a_budget_balanced_round_re_sorts_the_cheapest_blocks_within_its_slack"),
               "a last block of one step is re-sorted (a no-op for balance) and keeps a larger block off that step"),
    CodeMutant("exchange_balance_blocks_of_two", "odb/batching/exchange.py",
               "cand = by_budget[_stable_order(place // (K * n))]", "cand = by_budget[_stable_order(place // (2 * n))]",
               (X + "test_a_budget_balanced_round_re_sorts_the_cheapest_blocks_within_its_slack",),
               "every block size re-sorts blocks of 2 steps: a larger block is taken with a smaller one's order"),
    CodeMutant("exchange_radix_top_digit_dropped", "odb/batching/exchange.py",
               "    for shift in range(16, bits, 16):\n", "    for shift in range(16, bits - 16, 16):\n",
               (X + "test_fills_of_any_int64_width_keep_every_rule_and_the_array_plan_agrees",
                X + "test_a_budget_balanced_round_re_sorts_the_cheapest_blocks_within_its_slack"),
               "rule 1's radix sort skips the fills' top 16-bit digit: wide fills run out of order"),
    CodeMutant("exchange_radix_digits_unstable", "odb/batching/exchange.py",
               '(((key[idx] >> shift) & 0xFFFF).astype(np.uint16), kind="stable")',
               '(((key[idx] >> shift) & 0xFFFF).astype(np.uint16), kind="quicksort")',
               (X + "test_fills_of_any_int64_width_keep_every_rule_and_the_array_plan_agrees",),
               "a later digit's pass is not stable: it undoes the lower digits' order, so wide fills run out of order"),
    CodeMutant("exchange_radix_overflows", "odb/batching/exchange.py",
               "_stable_order(v.max().astype(np.uint64) - v.astype(np.uint64))", "_stable_order(v.max() - v)",
               (X + "test_fills_as_far_apart_as_int64_allows_keep_their_order",),
               "the distance below the largest fill in int64: fills more than 2^63 apart wrap and run out of order"),
    # -- the exchange in the loader: its transfer on gloo and its conformance condition --------------------------
    CodeMutant("transfer_only_by_receivers", "odb/runtime/engine.py",
               "moves = self._exchange(out) if out.send or out.expect or core.receiving else None",
               "moves = self._exchange(out) if out.expect or core.receiving else None",
               (E + "test_the_loader_exchanges_on_gloo_ranks_as_simulated_and_its_traces_conform",),
               "a rank that only sends in a round skips the transfer: its receivers wait for batches that never "
               "come (a RankFailure after timeout_s, every batch of the round lost)"),
    CodeMutant("transfer_unpicklable_peer_not_told", "odb/runtime/transport.py",
               '                data = pickle.dumps(("error", f"rank {self.rank} could not pickle dataset indices {what} "\n'
               '                                              f"({type(e).__name__}: {str(e)[:200]})"))\n',
               "                continue\n",
               (E + "test_a_batch_that_cannot_be_pickled_stops_every_rank_through_the_table",),
               "a batch that cannot be pickled is not announced: its receiver waits the whole timeout_s and "
               "fails with a RankFailure that does not say why"),
    CodeMutant("transfer_loss_not_declared", "odb/runtime/engine.py",
               "self.core.receive(got, lost=bool(errors))", "self.core.receive(got)",
               (E + "test_a_batch_that_cannot_be_pickled_stops_every_rank_through_the_table",),
               "a receiver whose batch was not sent does not stop through the table: a ProtocolError ends its "
               "thread and its peers hang in the next collective until timeout_s"),
    CodeMutant("transfer_drops_positions", "odb/runtime/transport.py",
               "got[origin] = Batch(samples, positions, indices, sizes_, counts)",
               "got[origin] = Batch(samples, (), indices, sizes_, counts)",
               (E + "test_the_loader_exchanges_on_gloo_ranks_as_simulated_and_its_traces_conform",),
               "a moved batch arrives without its positions: the ledger never records it, and a resume emits its "
               "samples again"),
    CodeMutant("conformance_exchange_unchecked", "proofs/conformance/check.py",
               'if loaded[0][0]["cfg"].get("xchg") == 1:', "if False:",
               (C + "test_a_tampered_exchange_trace_is_rejected",),
               "the checker ignores the exchange: a trace of moves the plan does not make passes"),
    CodeMutant("conformance_exchange_slack_ignored", "proofs/conformance/check.py",
               "_check_exchange(ranks, rep, decided, lanes, slack.pop())",
               "_check_exchange(ranks, rep, decided, lanes)",
               (E + "test_the_loader_exchanges_on_gloo_ranks_as_simulated_and_its_traces_conform",),
               "the checker recomputes the plan without the run's slack: a budget-balanced run is reported "
               "non-conformant (and a run that ignored its slack would pass a check that shares the bug)"),
    CodeMutant("settings_slack_not_compared", "odb/runtime/settings.py",
               "exchange=self.exchange, exchange_slack=self.slack_bp)", "exchange=self.exchange)",
               (E + "test_the_exchange_setting_is_refused_where_ranks_run_different_steps_or_bring_their_own_samples",),
               "ranks with different slacks pass the construction check and plan differently: batches lost and "
               "repeated"),
    CodeMutant("conformance_exchange_positions_unchecked", "proofs/conformance/check.py",
               "elif got[key] is not None and sent[key] != got[key]:", "elif False:",
               (C + "test_a_tampered_exchange_trace_is_rejected",),
               "a batch that reaches its receiver with other positions than it left with passes the checker"),
    # -- check_packing: a model that mixes packed samples is refused (odb.batching.collate) -----------------------
    CodeMutant("packing_probe_unchanged", "odb/batching/collate.py",
               "    changed = [(ids[0] + 1 + torch.randint(0, vocab - 1, (lengths[0],), generator=gen)) % vocab, *ids[1:]]\n",
               "    changed = list(ids)\n",
               (K + "test_a_model_whose_layers_carry_state_across_samples_is_refused",
                K + "test_a_packed_row_without_use_cache_false_mixes_an_attention_models_samples_and_is_refused"),
               "the probe changes nothing, so every model passes: a Mamba or convolution model trains on mixed samples"),
    CodeMutant("packing_probe_reads_the_changed_sample", "odb/batching/collate.py",
               "    later = slice(lengths[0], sum(lengths))", "    later = slice(0, sum(lengths))",
               (K + "test_attention_keeps_packed_samples_apart_and_the_models_mode_is_restored",),
               "the leak includes the sample that was changed: every model is refused"),
    CodeMutant("packing_tolerance_ignored", "odb/batching/collate.py", "    if not leak <= tol:\n",
               "    if False:\n",
               (K + "test_a_model_whose_layers_carry_state_across_samples_is_refused",),
               "a measured leak is returned but never refused"),
    CodeMutant("packing_mode_not_restored", "odb/batching/collate.py", "        model.train(training)\n",
               "        pass\n",
               (K + "test_attention_keeps_packed_samples_apart_and_the_models_mode_is_restored",),
               "the probe leaves a training model in eval mode: dropout is off for the whole run"),
    # -- the round exchange's decision (odb.batching.exchange; the scale grid's prototype runs it) ----------------
    CodeMutant("exchange_lightest_first", "odb/batching/exchange.py",
               "_stable_order(v.max().astype(np.uint64) - v.astype(np.uint64))",
               "_stable_order(v.astype(np.uint64) - v.min().astype(np.uint64))",
               (X + "test_a_hand_worked_round_moves_only_the_batches_whose_rank_is_taken_in_their_step",
                X + "test_every_fill_combination_at_small_scope_keeps_every_rule"),
               "the round's batches are dealt lightest first: a step's batches are still neighbours in fill, "
               "but not the order the rules and the prototype's figures state"),
    CodeMutant("exchange_never_stays", "odb/batching/exchange.py", "    stay = first[where] == pos\n",
               "    stay = first[where] < 0\n",
               (X + "test_a_hand_worked_round_moves_only_the_batches_whose_rank_is_taken_in_their_step",
                X + "test_every_fill_combination_at_small_scope_keeps_every_rule"),
               "every batch moves to the free ranks in order: the same balance for far more data moved"),
    CodeMutant("exchange_overwrites_a_taken_rank", "odb/batching/exchange.py",
               "free = np.flatnonzero(~taken)", "free = np.arange(taken.size)",
               (X + "test_a_hand_worked_round_moves_only_the_batches_whose_rank_is_taken_in_their_step",
                X + "test_every_fill_combination_at_small_scope_keeps_every_rule"),
               "a moving batch lands on a rank that already runs one in the step: a batch is lost"),
    CodeMutant("exchange_check_counts_only", "odb/batching/exchange.py",
               "    assert ran == real,", "    assert len(ran) == len(real),",
               (X + "test_a_plan_that_loses_repeats_or_invents_a_batch_is_refused",),
               "the plan's check counts batches: a repeated batch in place of a lost one passes"),
    CodeMutant("replay_receives_empty_batches", "odb/core/sim.py",
               "batches = {s: Batch([None] * len(got[s][0]), *map(tuple, got[s])) for _, s in o.expect}",
               "batches = {s: Batch([None] * len(got[s][0]), *map(tuple, got[s][:3]), (0, 0, 0)) for _, s in o.expect}",
               ("tests/test_bench_decision.py::test_an_exchanging_rank_replayed_alone_receives_what_the_simulation_"
                "moved_and_posts_what_it_posted",),
               "the decision benchmark's replay hands the rank batches without their counts: it times another run "
               "than the one recorded"),
    # -- the benchmark's machine reference (paper_repro.cpu) ----------------------------------------------------
    CodeMutant("reference_result_unchecked", "paper_repro/cpu.py", "        if got != REFERENCE_CHECKSUM:\n",
               "        if False:\n",
               ("tests/test_repro_stats.py::test_the_reference_workload_is_fixed_and_a_changed_one_is_refused",),
               "a changed reference workload is timed anyway (result files would compare unlike work)"),
    CodeMutant("reference_workload_shortened", "paper_repro/cpu.py", "for i in order[:50_000]:",
               "for i in order[:40_000]:",
               ("tests/test_repro_stats.py::test_the_reference_workload_is_fixed_and_a_changed_one_is_refused",),
               "the reference workload does less work under the same checksum constant"),
)


def by_name(name: str) -> CodeMutant:
    for m in MUTANTS:
        if m.name == name:
            return m
    raise KeyError(f"no code mutant {name!r}; mutants: {[m.name for m in MUTANTS]}")


def apply(m: CodeMutant, root: Path) -> None:
    """Apply `m` to the tree at `root`; raises ValueError unless `old` occurs exactly once."""
    p = root / m.path
    text = p.read_text()
    if text.count(m.old) != 1:
        raise ValueError(f"code mutant {m.name}: its text occurs {text.count(m.old)} times in {m.path}, not once")
    p.write_text(text.replace(m.old, m.new))


def _copy_tree(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)


def hypothesis_mutants(root: Path = ROOT) -> list[CodeMutant]:
    """The mutants whose tests include a test function decorated with hypothesis's ``@given``."""
    given = set()
    for p in (root / "tests").glob("test_*.py"):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.FunctionDef) and any(ast.unparse(d).startswith("given")
                                                         for d in node.decorator_list):
                given.add(f"tests/{p.name}::{node.name}")
    return [m for m in MUTANTS if any(t.split("[")[0] in given for t in m.tests)]


def _pytest(root: Path, tests: tuple[str, ...], timeout: int, seed: int | None = None) -> tuple[int, float, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    extra = []
    if seed is not None:
        shutil.rmtree(root / ".hypothesis", ignore_errors=True)  # no failing example stored by an earlier run
        extra = [f"--hypothesis-seed={seed}"]
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *extra, *tests],
                             cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
        rc, tail = out.returncode, (out.stdout + out.stderr).strip().splitlines()[-1:]
    except subprocess.TimeoutExpired:
        rc, tail = -9, ["timeout"]
    return rc, time.monotonic() - t0, " ".join(tail)


def run(names: list[str] | None = None, timeout: int = 600, log=print, seeds: list[int] | None = None) -> list[dict]:
    """Baseline each mutant's tests on an unmutated copy, then on the mutant; return one record each.  With
    `seeds`: only `hypothesis_mutants`, baseline and mutant once per seed, killed only if killed under every seed."""
    chosen = [by_name(n) for n in names] if names else list(MUTANTS)
    if seeds:
        hyp = {m.name for m in hypothesis_mutants()}
        chosen = [m for m in chosen if m.name in hyp]
    out = []
    with tempfile.TemporaryDirectory(prefix="odb-code-mutants-") as tmp:
        base = Path(tmp) / "base"
        _copy_tree(base)
        probe = subprocess.run([sys.executable, "-c", "import odb; print(odb.__file__)"], cwd=base,
                               capture_output=True, text=True)
        if not probe.stdout.startswith(str(base)):
            raise RuntimeError(f"the copy imports odb from {probe.stdout.strip()}, not from {base}")
        for m in chosen:
            work = Path(tmp) / m.name
            shutil.copytree(base, work)
            apply(m, work)
            runs = []
            for seed in seeds or [None]:
                rc0, s0, tail0 = _pytest(base, m.tests, timeout, seed)
                rc, s, tail = _pytest(work, m.tests, timeout, seed)
                runs.append((rc0 == 0, rc0 == 0 and rc != 0, s0 + s, tail, tail0))
            shutil.rmtree(work)
            rec = {"name": m.name, "survivor_class": m.survivor, "baseline_passes": all(r[0] for r in runs),
                   "killed": all(r[1] for r in runs), "seconds": round(sum(r[2] for r in runs), 1),
                   "mutant_tail": runs[-1][3], "baseline_tail": runs[-1][4]}
            if seeds:
                rec["killed_under_seeds"] = [seed for seed, r in zip(seeds, runs) if r[1]]
            verdict = 'KILLED' if rec['killed'] else ('BASELINE FAILS' if not rec['baseline_passes'] else 'SURVIVED')
            under = f" under {len(rec['killed_under_seeds'])}/{len(seeds)} seeds" if seeds else ""
            log(f"{m.name:36} {verdict}{under} ({rec['seconds']} s) {rec['mutant_tail']}")
            out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="mutant names (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--hypothesis-seeds", help="comma-separated seeds: only the mutants a hypothesis property "
                    "tests, each run once per seed (see the module docstring)")
    a = ap.parse_args(argv)
    if a.list:
        for m in MUTANTS:
            print(f"{m.name:36} {m.path:32} {m.doc}")
        return 0
    t0 = time.monotonic()
    res = run(a.only, seeds=[int(x) for x in a.hypothesis_seeds.split(",")] if a.hypothesis_seeds else None)
    killed = sum(r["killed"] for r in res)
    surv = [r for r in res if r["survivor_class"]]
    print(f"\n{killed}/{len(res)} killed ({sum(r['killed'] for r in surv)}/{len(surv)} of the classes that survived "
          f"before issue 12); {time.monotonic() - t0:.0f} s")
    return 0 if killed == len(res) else 1


if __name__ == "__main__":
    sys.exit(main())
