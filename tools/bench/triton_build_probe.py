"""tools/bench/triton_build_probe.py [CANDIDATE.py]: on a GPU machine, where a Triton kernel's
first call spends its time in a process with an empty Triton cache (the Triton driver's
cuda_utils module, the kernel's compile, its launcher), and whether compiling the kernel from
the text of its first IR (TTIR, generated in the process) gives the same binary as Triton's own
compile. Prints JSON lines."""
import importlib.util, json, os, sys, tempfile, time

cache = tempfile.mkdtemp(prefix="triton-probe-")
os.environ["TRITON_CACHE_DIR"] = cache
import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime import driver  # noqa: E402
import triton.compiler.compiler as tcc  # noqa: E402
import triton.backends.nvidia.driver as nvd  # noqa: E402

laps = {}


def timed(name, fn):
    def inner(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            laps[name] = laps.get(name, 0.0) + time.perf_counter() - t
    return inner


captured = {}
orig_compile = tcc.compile


def capture_compile(src, target=None, options=None, _env_vars=None):
    captured.update(src=src, target=target, options=options)
    return orig_compile(src, target=target, options=options, _env_vars=_env_vars)


tcc.compile = timed("kernel_compile", capture_compile)
triton.compiler.compile = tcc.compile
nvd.compile_module_from_src = timed("compile_module_from_src", nvd.compile_module_from_src)

t = time.perf_counter()
driver.active.utils  # noqa: B018  (CudaUtils: compiles cuda_utils with the C compiler)
laps["driver_utils"] = time.perf_counter() - t
laps.pop("compile_module_from_src", None)
path = sys.argv[1] if len(sys.argv) > 1 else "tools/bench/eval_gpu/candidates/gelu_tanh_affine.py"
spec = importlib.util.spec_from_file_location("cand", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
x = torch.randn(1 << 20, device="cuda")
s, b = torch.randn_like(x), torch.randn_like(x)
model = mod.ModelNew()
torch.cuda.synchronize()
t = time.perf_counter()
model(x, s, b)
torch.cuda.synchronize()
laps["first_call"] = time.perf_counter() - t
t = time.perf_counter()
model(x, s, b)
torch.cuda.synchronize()
laps["second_call"] = time.perf_counter() - t
print(json.dumps({"triton": triton.__version__, "laps_s": {k: round(v, 4) for k, v in laps.items()}}))

# The kernel again, through its TTIR text: made here, compiled as a separate step.
from triton._C.libtriton import ir  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.backends.compiler import Language  # noqa: E402

src, target, options_in = captured["src"], captured["target"], captured["options"]
t = time.perf_counter()
backend = make_backend(target)
options = backend.parse_options(dict(options_in or {}, **src.parse_options()))
ctx = ir.context()
ir.load_dialects(ctx)
backend.load_dialects(ctx)
module = src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), ctx)
ttir = str(module)
make_ir_s = time.perf_counter() - t


def tupled(v):
    return tuple(tupled(x) for x in v) if isinstance(v, list) else v


opts_json = json.loads(json.dumps(options.__dict__))
t = time.perf_counter()
backend2 = make_backend(triton.backends.compiler.GPUTarget(target.backend, target.arch, target.warp_size))
options2 = backend2.parse_options({k: tupled(v) for k, v in opts_json.items()})
ctx2 = ir.context()
ir.load_dialects(ctx2)
backend2.load_dialects(ctx2)
with tempfile.NamedTemporaryFile("w", suffix=".ttir", delete=False) as f:
    f.write(ttir)
m = ir.parse_mlir_module(f.name, ctx2)
m.context = ctx2
metadata = {"hash": "probe", "target": target, **options2.__dict__, "triton_version": triton.__version__}
stages = {}
backend2.add_stages(stages, options2, Language.TRITON)
out = {}
for ext, fn in stages.items():
    m = fn(m, metadata)
    out[ext] = m
build_s = time.perf_counter() - t
ref = orig_compile(src, target=target, options=options_in)
same = {ext: (out[ext] == ref.asm[ext]) if ext in ref.asm else None for ext in out}
print(json.dumps({"make_ir_s": round(make_ir_s, 4), "ttir_chars": len(ttir), "has_loc": "loc(" in ttir,
                  "build_from_ttir_s": round(build_s, 4), "options_roundtrip": options2.__dict__ == options.__dict__,
                  "same_as_triton": same,
                  "metadata_diff": sorted(k for k in set(metadata) | set(ref.metadata._asdict())
                                          if k not in ("hash", "target") and str(metadata.get(k)) != str(ref.metadata._asdict().get(k)))}))
