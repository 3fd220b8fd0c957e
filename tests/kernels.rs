//! Custom-kernel wrappers: misuse caught in Rust, MLX's back-end errors as values, and a trivial
//! kernel that runs for real where its back-end exists.

mod common;

use common::require_cuda;
use mlx_trellis::{backend, Backend, CudaKernel, Dtype, KernelSource, LaunchConfig, MetalKernel, MlxArray};

fn scale_source() -> KernelSource {
    KernelSource::new("mlx_trellis_test_scale", &["inp"], &["out"], "/* body */ out[0] = inp[0];")
}

#[test]
fn a_kernel_needs_outputs_and_identifiers() {
    let mut s = scale_source();
    s.output_names.clear();
    let err = MetalKernel::new(s, false).err().expect("no outputs is refused");
    assert!(err.to_string().contains("at least one output"), "{err}");
    let mut s = scale_source();
    s.input_names = vec!["in put".into()];
    let err = MetalKernel::new(s, false).err().expect("bad name is refused");
    assert!(err.to_string().contains("not an identifier"), "{err}");
    let mut s = scale_source();
    s.input_names = vec!["out".into()];
    let err = MetalKernel::new(s, false).err().expect("duplicate name is refused");
    assert!(err.to_string().contains("used twice"), "{err}");
}

#[test]
fn launch_misuse_is_caught_before_mlx() {
    let k = MetalKernel::new(scale_source(), false).unwrap();
    let x = MlxArray::from_slice(&[1.0f32], &[1]).unwrap();
    let cfg = LaunchConfig::new([1, 1, 1], [1, 1, 1]).output(&[1], Dtype::Float32);
    let err = k.apply(&[&x, &x], &cfg).unwrap_err();
    assert!(err.to_string().contains("2 inputs given for 1 input names"), "{err}");
    let err = k.apply(&[&x], &LaunchConfig::new([1, 1, 1], [1, 1, 1])).unwrap_err();
    assert!(err.to_string().contains("0 outputs configured for 1 output names"), "{err}");
    let err = k.apply(&[&x], &cfg.clone().template_int("N", 1).template_dtype("N", Dtype::Float32)).unwrap_err();
    assert!(err.to_string().contains("template argument \"N\" is given twice"), "{err}");
    let err = k.apply(&[&x], &cfg.clone().template_dtype("T", Dtype::Float64)).unwrap_err();
    assert!(err.to_string().contains("not a GPU kernel type"), "{err}");
    let err = k.apply(&[&x], &cfg.clone().template_int("N", -2)).unwrap_err();
    assert!(err.to_string().contains("template int N = -2 is negative"), "{err}");
    let err = k.apply(&[&x], &cfg.clone().template_int("inp", 3)).unwrap_err();
    assert!(err.to_string().contains("has the name of a kernel argument"), "{err}");
    let err = k.apply(&[&x], &LaunchConfig::new([0, 1, 1], [1, 1, 1]).output(&[1], Dtype::Float32)).unwrap_err();
    assert!(err.to_string().contains("grid"), "{err}");
}

#[test]
fn a_metal_kernel_runs_on_metal_and_is_an_error_not_an_exit_elsewhere() {
    let k = MetalKernel::new(scale_source(), false).expect("Metal kernels can be created anywhere");
    let x = MlxArray::from_slice(&[1.0f32], &[1]).unwrap();
    let cfg = LaunchConfig::new([1, 1, 1], [1, 1, 1]).output(&[1], Dtype::Float32);
    let result = k.apply(&[&x], &cfg).and_then(|outs| outs[0].eval().map(|_| outs));
    if backend() == Backend::Metal {
        assert_eq!(result.unwrap()[0].to_vec::<f32>().unwrap(), vec![1.0]);
        return;
    }
    let err = result.expect_err("no Metal back-end");
    assert!(format!("{err:#}").contains("No Metal back-end"), "{err:#}");
    // The process is still alive and MLX still works.
    assert_eq!(x.add(&x).unwrap().to_vec::<f32>().unwrap(), vec![2.0]);
}

const AXPB_CUDA: &str = r#"
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < N) out[i] = T(float(inp[i]) * float(SCALE) + 1.0f);
"#;

fn axpb_source() -> KernelSource {
    KernelSource::new("mlx_trellis_test_axpb", &["inp"], &["out"], AXPB_CUDA)
}

/// [`axpb_source`]'s launch over `n` elements of `dtype` in blocks of `block` threads.
fn axpb_launch(n: usize, block: usize, dtype: Dtype, scale: i32) -> LaunchConfig {
    LaunchConfig::new([n, 1, 1], [block, 1, 1])
        .output(&[n], dtype)
        .template_dtype("T", dtype)
        .template_int("N", n as i32)
        .template_int("SCALE", scale)
}

#[test]
fn a_cuda_kernel_is_created_on_cuda_and_refused_at_creation_elsewhere() {
    if backend() == Backend::Cuda {
        CudaKernel::new(axpb_source(), 0).expect("creation succeeds on CUDA");
        return;
    }
    let err = CudaKernel::new(axpb_source(), 0).err().expect("no CUDA back-end");
    assert!(format!("{err:#}").contains("No CUDA back-end"), "{err:#}");
}

/// An elementwise kernel with a template dtype and int, run for real on MLX's CUDA back-end.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn a_trivial_cuda_kernel_runs_on_cuda() {
    require_cuda();
    let k = CudaKernel::new(axpb_source(), 0).unwrap();
    let n = 1000usize;
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 - 7.0).collect();
    for (dtype, scale) in [(Dtype::Float32, 3), (Dtype::Bfloat16, 5)] {
        let x = MlxArray::from_slice(&values, &[n]).unwrap().astype(dtype).unwrap();
        let cfg = axpb_launch(n, 256, dtype, scale);
        let out = k.apply(&[&x], &cfg).unwrap().remove(0);
        // The same launch prepared once and applied twice.
        let launch = k.prepare(&cfg).unwrap();
        let prepared: Vec<MlxArray> = (0..2).map(|_| k.apply_prepared(&[&x], &launch).unwrap().remove(0)).collect();
        let got = out.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
        let xs = x.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap();
        for (i, (g, xv)) in got.iter().zip(&xs).enumerate() {
            let want = xv * scale as f32 + 1.0;
            let want = if dtype == Dtype::Bfloat16 { half::bf16::from_f32(want).to_f32() } else { want };
            assert_eq!(*g, want, "{dtype} element {i}");
        }
        for p in &prepared {
            assert_eq!(p.astype(Dtype::Float32).unwrap().to_vec::<f32>().unwrap(), got, "{dtype}, prepared launch");
        }
    }
}

/// A prepared launch is checked once, when prepared, and serves only kernels with its argument
/// names.
#[test]
#[ignore = "needs MLX's CUDA back-end"]
fn a_prepared_cuda_launch_is_checked() {
    require_cuda();
    let k = CudaKernel::new(axpb_source(), 0).unwrap();
    let cfg = axpb_launch(4, 4, Dtype::Float32, 2);
    let no_outputs = LaunchConfig::new([4, 1, 1], [4, 1, 1]);
    let err = k.prepare(&no_outputs).unwrap_err();
    assert!(format!("{err:#}").contains("0 outputs configured for 1 output names"), "{err:#}");
    let launch = k.prepare(&cfg).unwrap();
    let other = CudaKernel::new(
        KernelSource::new(
            "mlx_trellis_test_copy",
            &["src"],
            &["out"],
            "if (threadIdx.x < 4) out[threadIdx.x] = src[threadIdx.x];",
        ),
        0,
    )
    .unwrap();
    let x = MlxArray::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    let err = other.apply_prepared(&[&x], &launch).unwrap_err();
    assert!(format!("{err:#}").contains("launch prepared for arguments [\"inp\"] -> [\"out\"]"), "{err:#}");
    let err = k.apply_prepared(&[&x, &x], &launch).unwrap_err();
    assert!(format!("{err:#}").contains("2 inputs given for 1 input names"), "{err:#}");
    let y = k.apply_prepared(&[&x], &launch).unwrap().remove(0);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 5.0, 7.0, 9.0]);
}
