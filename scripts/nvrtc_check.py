#!/usr/bin/env python3
"""Compile a CUDA kernel body the way MLX's `cuda_kernel` does, without a GPU: the generated
signature and template constants around the body, NVRTC for sm_90a, and ptxas's register and
spill report. A development aid for the kernels under kernels/cuda/ (compile errors and register
counts cost no GPU time).

Needs NVRTC and the CUDA headers (pip: nvidia-cuda-nvrtc, nvidia-cuda-runtime and
nvidia-cuda-cccl, CUDA 13, in --site) and MLX's CUDA device headers (mlx/backend/cuda/device/
from MLX's sources of the linked version, in --mlx-src).

  scripts/nvrtc_check.py --arch sm_90 --body kernels/cuda/gate_up.cu \\
      --header kernels/cuda/codebook.cuh --header kernels/cuda/fragment.cuh --header kernels/cuda/axis_one.cuh \\
      --inputs x:bfloat16 x_exp:float16 codes:uint32 scales:float16 --outputs y:bfloat16 --shape x scales \\
      --define TRELLIS_FUSED=0 --template T=bfloat16 Y=bfloat16 K=3 L=12 MT=1 RT=2 WARPS=4 \\
      SPLIT_X=false BIAS_FOLD=true PACK_FMA=true LIFT=true HANDED=false STAGE=false

NVRTC_FULL_LOG=1 prints NVRTC's whole log (ptxas's per-function report) instead of its errors,
warnings, register and spill lines.
"""
import argparse
import ctypes
import glob
import os
import sys

CUDA_TYPES = {
    "float32": "float",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "uint32": "uint32_t",
    "int32": "int32_t",
}


def kernel_text(args):
    header = "".join(open(h).read() + "\n" for h in args.header)
    body = open(args.body).read()
    defines = "".join(f"#define {d.split('=')[0]} {d.split('=')[1] if '=' in d else 1}\n" for d in args.define)
    text = '#include "mlx/backend/cuda/device/utils.cuh"\n\n#include <cooperative_groups.h>\n\n'
    text += defines + header
    text += "namespace mlx::core::cu {\n\nnamespace cg = cooperative_groups;\n\n__global__ void custom_kernel_check(\n"
    params = []
    for spec in args.inputs:
        name, dtype = spec.split(":")
        params.append(f"    const {CUDA_TYPES[dtype]}* {name}")
        if name in args.shape:
            params.append(f"    const __grid_constant__ Shape {name}_shape")
    for spec in args.outputs:
        name, dtype = spec.split(":")
        params.append(f"    {CUDA_TYPES[dtype]}* {name}")
    text += ",\n".join(params) + ") {\n"
    for t in args.template:
        name, value = t.split("=")
        if value in CUDA_TYPES:
            text += f"  using {name} = {CUDA_TYPES[value]};\n"
        elif value in ("true", "false"):
            text += f"  constexpr bool {name} = {value};\n"
        else:
            text += f"  constexpr int {name} = {int(value)};\n"
    text += "\n" + body + "\n}\n\n} // namespace mlx::core::cu\n"
    return text


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--body", required=True)
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--inputs", nargs="+", default=[])
    p.add_argument("--outputs", nargs="+", default=[])
    p.add_argument("--shape", nargs="*", default=[], help="inputs whose NAME_shape the body reads")
    p.add_argument("--define", nargs="*", default=[], help="source-variant flags, e.g. TRELLIS_FUSED=1")
    p.add_argument("--template", nargs="*", default=[])
    p.add_argument("--site", default=os.environ.get("NVRTC_SITE", "/tmp/nvrtc/site"))
    p.add_argument("--mlx-src", default=os.environ.get("MLX_SRC", "/tmp/nvrtc/mlxsrc"))
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--dump", help="write the generated source here")
    p.add_argument("--cubin", help="write the compiled CUBIN here (for cuobjdump --dump-sass)")
    args = p.parse_args()
    text = kernel_text(args)
    if args.dump:
        open(args.dump, "w").write(text)
    cu = os.path.join(args.site, "nvidia", "cu13")
    # NVRTC opens its builtins library by name at compile time: loaded here first, it is found
    # without LD_LIBRARY_PATH.
    for builtins in sorted(glob.glob(os.path.join(cu, "lib", "libnvrtc-builtins.so.*"))):
        ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    nvrtc = ctypes.CDLL(os.path.join(cu, "lib", "libnvrtc.so.13"))
    prog = ctypes.c_void_p()
    src = text.encode()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"check.cu", 0, None, None) != 0:
        sys.exit("nvrtcCreateProgram failed")
    opts = [
        "--device-as-default-execution-space",
        f"--gpu-architecture={args.arch}",
        f"--include-path={args.mlx_src}",
        f"--include-path={os.path.join(cu, 'include', 'cccl')}",
        f"--include-path={os.path.join(cu, 'include')}",
        "--ptxas-options=--verbose",
    ]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    result = nvrtc.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    text_log = log.value.decode(errors="replace")
    lines = [l for l in text_log.splitlines() if "error" in l or "Used" in l or "spill" in l or "warning" in l]
    print(text_log if os.environ.get("NVRTC_FULL_LOG") else ("\n".join(lines) if result == 0 else text_log))
    if result == 0 and args.cubin:
        nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        open(args.cubin, "wb").write(cubin.raw)
    sys.exit(0 if result == 0 else 1)


if __name__ == "__main__":
    main()
