"""XLA:TPU's latency-hiding schedule, read from the text proto it dumps: libtpu 0.0.52's layout (one block per
scheduled computation, as a real v6e dump, cut short) and an older one (one schedule inside the module)."""

from meshlab.check.tpu_schedule import collective_kind, parse_schedule

DUMP = """hlo_module {
  name: "IrToHlo.1"
  computations {
    name: "main_spmd"
    instructions {
      name: "fusion.1"
      opcode: "fusion"
      shape {
        element_type: BF16
      }
      metadata {
        op_name: "transformer_blocks.0#/aten__mm"
      }
      id: 11
    }
    instructions {
      name: "all-reduce.2"
      opcode: "all-reduce"
      id: 12
    }
    instructions {
      name: "collective-permute-done"
      opcode: "collective-permute-done"
      id: 13
    }
    instructions {
      name: "copy.4"
      opcode: "copy"
      id: 14
    }
  }
  schedule {
    instructions {
      id: 11
      start_timestamp_cycles: 0
      end_timestamp_cycles: 1750000
    }
    instructions {
      id: 12
      start_timestamp_cycles: 1750000
      end_timestamp_cycles: 2100000
    }
    instructions {
      id: 13
      start_timestamp_cycles: 2100000
      end_timestamp_cycles: 2275000
    }
    instructions {
      id: 14
      start_timestamp_cycles: 2275000
      end_timestamp_cycles: 2275001
    }
    scheduler_statistics {
      total_cycles: 2275001
      collective_permute_wasted_cycles: 175000
      memory_pressure_peak: 64
    }
  }
  cycles_per_microsecond: 1750
}
"""


def test_reads_the_total_and_what_each_collective_kind_holds_of_the_timeline():
    s = parse_schedule(DUMP)
    assert abs(s.total_s - 2275001 / 1750e6) < 1e-12  # 1.3 ms
    assert s.by_kind == {"all-reduce": 350000 / 1750e6, "collective-permute": 175000 / 1750e6}
    assert abs(s.compute_s - (2275001 - 525000) / 1750e6) < 1e-12
    assert s.wasted_s == {"collective_permute": 175000 / 1750e6}


def test_a_text_without_a_schedule_is_none_and_async_dones_count_as_their_kind():
    assert parse_schedule("hlo_module {\n}\n") is None
    assert collective_kind("all-gather-done.3", "all-gather-done") == "all-gather"
    assert collective_kind("async-collective-done.2.all-gather", "fusion") == "all-gather"
    assert collective_kind("fusion.7", "fusion") is None


LOOPED = """hlo_module {
  name: "IrToHlo.2"
  computations {
    name: "body"
    instructions {
      name: "collective-permute-done.1"
      opcode: "collective-permute-done"
      id: 21
    }
    instructions {
      name: "fusion.2"
      opcode: "fusion"
      id: 22
    }
    id: 2
  }
  computations {
    name: "main_spmd"
    instructions {
      name: "all-gather.3"
      opcode: "all-gather"
      id: 31
    }
    instructions {
      name: "while.4"
      opcode: "while"
      id: 32
      operand_ids: 31
      called_computation_ids: 2
      called_computation_ids: 5
    }
    id: 3
  }
  entry_computation_id: 3
  schedule {
    sequences {
      key: 3
    }
  }
}
computation_schedules {
  computation_id: 2
  instructions {
    id: 21
    end_timestamp_cycles: 50
  }
  instructions {
    id: 22
    start_timestamp_cycles: 50
    end_timestamp_cycles: 100
  }
  scheduler_statistics {
    total_cycles: 100
  }
  cycles_per_microsecond: 1750
}
computation_schedules {
  computation_id: 3
  instructions {
    id: 31
    end_timestamp_cycles: 1750
  }
  instructions {
    id: 32
    start_timestamp_cycles: 1750
    end_timestamp_cycles: 8750
  }
  scheduler_statistics {
    total_cycles: 8750
  }
  cycles_per_microsecond: 1750
}
"""


def test_a_program_with_loops_is_read_from_its_entry_computation_s_schedule():
    """libtpu writes one computation_schedules block per scheduled computation (fsdp.yaml's program at full depth:
    361, one per collective-matmul loop body): the entry's total is the program's (5 us here, not the loop body's
    0.06 us); the loop's permutes count as their body's share times its trips (the while's 7000 cycles over the
    body's 100: 70); an instruction at cycle 0 has no start line (proto3 leaves a zero out)."""
    s = parse_schedule(LOOPED)
    assert abs(s.total_s - 5e-6) < 1e-12
    assert s.by_kind == {"all-gather": 1750 / 1750e6, "collective-permute": 70 * 50 / 1750e6}
    assert abs(s.compute_s - 2e-6) < 1e-12


def test_a_dump_whose_entry_schedule_is_missing_is_none():
    assert parse_schedule(LOOPED.replace("entry_computation_id: 3", "entry_computation_id: 7")) is None


def _op(name: str, opcode: str, i: int, op_name: str = "", source: str = "", called: int | None = None,
        target: str = "") -> str:
    """One instruction as libtpu writes it; its metadata as torch_xla's (an aten op name, the calling Python file)
    or torchax's (a torch function path in the op name, no file); a custom call's target after it."""
    meta = "".join(f'        {k}: "{v}"\n' for k, v in (("op_name", op_name), ("source_file", source)) if v)
    meta = f"      metadata {{\n{meta}      }}\n" if meta else ""
    meta += f'      custom_call_target: "{target}"\n' if target else ""
    calls = f"      called_computation_ids: {called}\n" if called is not None else ""
    return f'    instructions {{\n      name: "{name}"\n      opcode: "{opcode}"\n{meta}      id: {i}\n{calls}    }}\n'


#: a computation's fields after its instructions, as libtpu writes them: nested messages, then its id (none for 0)
_SHAPE = "    program_shape {\n      parameters {\n        element_type: F32\n      }\n    }\n"


def _computation(name: str, cid: int, *ops: str) -> str:
    own = f"    id: {cid}\n" if cid else ""  # proto3 leaves an id of 0 out
    return f'  computations {{\n    name: "{name}"\n{"".join(ops)}{_SHAPE}{own}    root_id: 1\n  }}\n'


def _slots(*spans: tuple[int, int, int]) -> str:
    return "".join(f"  instructions {{\n    id: {i}\n    start_timestamp_cycles: {s}\n    end_timestamp_cycles: {e}\n"
                   f"  }}\n" for i, s, e in spans)


LINEAR_PY, DISPATCH = "torch/nn/modules/linear.py", "diffusers/models/attention_dispatch.py"
SDPA = "jit(run)/attn#/scaled_dot_product_attention"
#: the entry's ops (1000 cycles a microsecond), each a fusion of a computation below or an op of its own: name,
#: opcode, id, the computation it calls, its span in cycles, the class it is
ENTRY = [
    ("fusion.a", "fusion", 31, 6, 1000, "matmuls"),  # a Linear's matmul (linear.py) in a fusion inside a fusion
    ("fusion.b", "fusion", 32, 2, 500, "attention"),  # the scores: only the calling file names the attention
    ("fusion.c", "fusion", 33, 4, 300, "attention"),  # the softmax: only torchax's op name names it
    ("fusion.d", "fusion", 34, 0, 200, "elementwise and reductions"),  # a norm, in the computation of id 0
    ("copy.e", "copy", 35, None, 50, "copies"),
    ("all-gather.f", "all-gather", 36, None, 200, None),
    ("get-tuple-element.g", "get-tuple-element", 37, None, 0, None),
    ("fusion.h", "fusion", 38, 7, 50, "matmuls"),  # a small Linear lowered to a multiply and a reduce
    ("fusion.i", "fusion", 39, 8, 30, "attention"),  # an attention processor's own product
    ("fusion.j", "fusion", 40, 9, 20, "elementwise and reductions"),  # ... and its residual add
    ("collective-permute-start.k", "collective-permute-start", 41, None, 1, None),
    ("collective-permute-done.k", "collective-permute-done", 42, None, 9, None),
    ("fusion.l", "fusion", 43, 10, 40, "matmuls"),  # a Linear's matmul and an attention's in one fusion
    ("fusion.m", "fusion", 44, 11, 25, "elementwise and reductions"),  # an add named after a Linear's aten op
    ("fusion.n", "fusion", 45, 12, 15, "elementwise and reductions"),  # a norm's multiply in SDPA-named reshapes
    ("fusion.o", "fusion", 46, 13, 5, "matmuls"),  # a matmul nothing names
    ("pallas_call.p", "custom-call", 47, None, 60, "attention"),  # a flash attention's Pallas kernel (torchax's)
    ("custom-call.q", "custom-call", 48, None, 7, "other ops"),  # a custom call that is not a Pallas kernel
    ("fusion.r", "fusion", 49, 14, 11, "attention"),  # a fusion around a Pallas kernel
]
#: the metadata of the entry's own ops, by id
ENTRY_META = {47: {"op_name": SDPA + "/shard_map/jit(flash_attention)/pallas_call", "target": "tpu_custom_call"},
              48: {"target": "ConcatBitcast"}}
CLASSED = ("hlo_module {\n  name: \"m\"\n"
           + _computation("fused_norm", 0, _op("reduce.5", "reduce", 501, "norm#/aten__mean",
                                               "diffusers/models/normalization.py"),
                          _op("exponential.5", "exponential", 502))
           + _computation("fused_linear", 1, _op("convolution.1", "convolution", 101, "to_q#/aten__mm", LINEAR_PY))
           + _computation("outer_linear", 6, _op("fusion.6", "fusion", 601, called=1))
           + _computation("fused_scores", 2, _op("convolution.2", "convolution", 201, "attn#", DISPATCH))
           + _computation("fused_softmax", 4, _op("reduce.4", "reduce", 401, SDPA + "/aten::softmax/reduce_max"))
           + _computation("small_linear", 7, _op("multiply.7", "multiply", 701),
                          _op("reduce.7", "reduce", 702, "norm1.linear#/linear/...a,ba->...b/dot_general"))
           + _computation("processor_product", 8, _op("convolution.8", "convolution", 801, "attn#",
                                                      "diffusers/models/attention_processor.py"))
           + _computation("processor_add", 9, _op("add.9", "add", 901, "attn#/aten__add",
                                                  "diffusers/models/attention_processor.py"))
           + _computation("mixed", 10, _op("convolution.10", "convolution", 1001, "attn#/aten__matmul", DISPATCH),
                          _op("convolution.11", "convolution", 1002, "to_out#/aten__mm", LINEAR_PY))
           + _computation("add_after_mm", 11, _op("add.12", "add", 1101, "to_out#/aten__addmm", "model.py"))
           + _computation("norm_in_views", 12, _op("bitcast.13", "bitcast", 1201, SDPA + "/aten::view/reshape"),
                          _op("multiply.13", "multiply", 1202, "attn#/norm_q#/aten::mul.Tensor/mul"),
                          _op("reshape.13", "reshape", 1203, SDPA + "/aten::view/reshape"))
           + _computation("bare_matmul", 13, _op("dot.14", "dot", 1301))
           + _computation("wrapped_kernel", 14, _op("pallas_call.15", "custom-call", 1401, SDPA + "/pallas_call",
                                                   target="tpu_custom_call"))
           + _computation("main_spmd", 3, *(_op(n, code, i, called=c, **ENTRY_META.get(i, {}))
                                            for n, code, i, c, _, _ in ENTRY))
           + "  host_program_shape {\n    parameters {\n      element_type: F32\n    }\n    result {\n"
           + "      element_type: F32\n    }\n  }\n"
           + "  entry_computation_id: 3\n}\ncomputation_schedules {\n  computation_id: 3\n"
           + _slots(*((i, start, start + span) for (_, _, i, _, span, _), start in zip(
               ENTRY, [sum(row[4] for row in ENTRY[:k]) + (100 if k > 6 else 0) for k in range(len(ENTRY))])))
           + f"  scheduler_statistics {{\n    total_cycles: {sum(row[4] for row in ENTRY) + 100}\n  }}\n"
           + "  cycles_per_microsecond: 1000\n}\n")


def test_the_timeline_s_ops_are_told_apart_by_what_they_hold_and_where_they_come_from():
    """A fusion holding a matmul, however deep, is a Linear's where a matmul names a Linear (even beside the
    attention's), the attention's where one names the attention's call or an attention processor's file, else a
    Linear's; one holding none is the attention's where an instruction that computes names its softmax or SDPA
    (not a reshape named after the SDPA that reads it), a Linear's where its reduce names a Linear (an add named
    so is not), else elementwise (an attention processor's add too); either metadata field names; the id-0
    computation a fusion calls is its own, not the entry's; an async pair's start and done are its collective's;
    100 cycles no op holds are idle; the classes sum to the timeline less its collectives."""
    s = parse_schedule(CLASSED)
    cycles = {k: round(v * 1e9) for k, v in s.by_op.items()}  # 1000 cycles a microsecond: 1 cycle a nanosecond
    expected = {"idle": 100}
    for _, _, _, _, span, what in ENTRY:
        if what:
            expected[what] = expected.get(what, 0) + span
    assert cycles == expected
    assert {k: round(v * 1e9) for k, v in s.by_kind.items()} == {"all-gather": 200, "collective-permute": 10}
    assert abs(sum(s.by_op.values()) - s.compute_s) < 1e-15
    assert s.to_json()["compute_s_by_op"] == s.by_op
    # of them, what a Pallas kernel holds (XLA:TPU times it by the kernel's own cost estimate): not another custom call
    assert {k: round(v * 1e9) for k, v in s.kernel_by_op.items()} == {"attention": 60 + 11}
    assert s.to_json()["kernel_s_by_op"] == s.kernel_by_op


def test_a_loop_s_ops_count_by_their_body_s_share_of_its_span():
    """LOOPED's body: a permute's 50 cycles and an unmarked fusion's 50, run for the while's 7000 cycles: 70 trips."""
    s = parse_schedule(LOOPED)
    assert {k: round(v * 1750e6) for k, v in s.by_op.items()} == {"elementwise and reductions": 3500}
