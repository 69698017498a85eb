"""SGLang's unified-cache linker interface, written out by hand from the
engine's source (python/sglang/srt/mem_cache/unified_cache/
unified_cache_linker.py and linker_factory.py at sgl-project/sglang commit
2c62dc66f5b22ff8e01b0d6cda668bf9b376306a), independently of the adapter's
own fallback restatement: each abstract method of ``UnifiedCacheLinker``
with its parameters (name, kind) and return annotation as SGLang writes
them, and the constructor call SGLang's factory makes for an out-of-tree
linker. test_sglang_unified.py checks the adapter against it with
inspect.signature, so a renamed, missing or re-shaped method fails.
"""

import inspect

P = inspect.Parameter
POS = P.POSITIONAL_OR_KEYWORD

# name -> ([(parameter, kind), ...] after self, return annotation)
UNIFIED_CACHE_LINKER = {
    "lookup": ([("rid", POS), ("transfers", POS)], "list[int]"),
    "load": ([("rid", POS), ("transfers", POS)], "bool"),
    "start_layer_wise_loading": ([], "int"),
    "cancel_queued_load": ([("rid", POS)], "bool"),
    "num_completed_loads": ([], "int"),
    "pop_completed_load": ([], "list[str]"),
    "offload": ([("transfers", POS)], "bool"),
    "num_completed_offloads": ([], "int"),
    "pop_completed_offload": ([], "bool"),
    "reset": ([], "None"),
    "close": ([], "None"),
}

# attributes the class body declares (annotations) and what they must offer
LAYER_DONE_COUNTER_METHODS = ("set_consumer", "wait_until")


def factory_call(cls, server_args, params, components, extra_config):
    """How linker_factory.create_unified_cache_linker builds an out-of-tree
    linker at that commit."""
    return cls(server_args, params, components=components, extra_config=extra_config)


def check_method(cls, name):
    """Mismatches (strings) between cls.name and SGLang's method."""
    want_params, want_ret = UNIFIED_CACHE_LINKER[name]
    fn = getattr(cls, name, None)
    if fn is None or not callable(fn):
        return ["%s: missing" % name]
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    bad = []
    if not params or params[0].name != "self":
        bad.append("%s: not a method taking self" % name)
        return bad
    got = [(p.name, p.kind) for p in params[1:] if p.default is P.empty]
    extra = [p.name for p in params[1:] if p.default is not P.empty]
    if got != want_params:
        bad.append("%s: parameters %s, SGLang's %s" % (name, got, want_params))
    if extra:
        bad.append("%s: extra parameters %s" % (name, extra))
    ret = sig.return_annotation
    ret = ret if isinstance(ret, str) else getattr(ret, "__name__", repr(ret))
    if ret != want_ret:
        bad.append("%s: returns %r, SGLang's %r" % (name, ret, want_ret))
    return bad
