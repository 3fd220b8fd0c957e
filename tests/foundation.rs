//! The safe binding: arrays, element types, operations, errors, memory, threads, safetensors.

use mlx_trellis::trellis::reference::rel_err;
use mlx_trellis::{
    backend, bf16, concatenate, f16, load_safetensors, quantize, quantized_matmul, random, save_safetensors, Backend,
    Dtype, Element, ErrorKind, MlxArray, Stream,
};
use std::collections::BTreeMap;

fn round_trip<T: Element + PartialEq + std::fmt::Debug>(values: &[T]) {
    let a = MlxArray::from_slice(values, &[values.len()]).unwrap();
    assert_eq!(a.dtype(), T::DTYPE);
    assert_eq!(a.shape(), vec![values.len()]);
    assert_eq!(a.to_vec::<T>().unwrap(), values, "{:?} round trip", T::DTYPE);
}

#[test]
fn every_element_type_round_trips() {
    round_trip(&[true, false, true]);
    round_trip(&[0u8, 7, 255]);
    round_trip(&[0u16, 513, u16::MAX]);
    round_trip(&[0u32, 0xDEAD_BEEF, u32::MAX]);
    round_trip(&[0u64, 1 << 40, u64::MAX]);
    round_trip(&[i8::MIN, -1, i8::MAX]);
    round_trip(&[i16::MIN, -2, i16::MAX]);
    round_trip(&[i32::MIN, -3, i32::MAX]);
    round_trip(&[i64::MIN, -4, i64::MAX]);
    round_trip(&[0.0f32, -1.5, f32::MAX, f32::MIN_POSITIVE]);
    let _cpu = Stream::cpu().unwrap().enter(); // float64 is a CPU-only type in MLX
    round_trip(&[0.0f64, -2.25, 1e300]);
}

#[test]
fn half_types_round_trip_bit_exact() {
    // Every 16-bit pattern that is not a NaN (NaN payloads need not survive).
    let f16s: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).filter(|v| !v.is_nan()).collect();
    let a = MlxArray::from_slice(&f16s, &[f16s.len()]).unwrap();
    let back = a.to_vec::<f16>().unwrap();
    assert!(back.iter().zip(&f16s).all(|(x, y)| x.to_bits() == y.to_bits()));

    let bf16s: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).filter(|v| !v.is_nan()).collect();
    let b = MlxArray::from_slice(&bf16s, &[bf16s.len()]).unwrap();
    let back = b.to_vec::<bf16>().unwrap();
    assert!(back.iter().zip(&bf16s).all(|(x, y)| x.to_bits() == y.to_bits()));

    // Conversions agree with the `half` crate's rounding.
    let x = MlxArray::from_slice(&[1.0f32 / 3.0, 65504.0, -0.1], &[3]).unwrap();
    let h = x.astype(Dtype::Float16).unwrap().to_vec::<f16>().unwrap();
    assert_eq!(h, vec![f16::from_f32(1.0 / 3.0), f16::from_f32(65504.0), f16::from_f32(-0.1)]);
    let b = x.astype(Dtype::Bfloat16).unwrap().to_vec::<bf16>().unwrap();
    assert_eq!(b, vec![bf16::from_f32(1.0 / 3.0), bf16::from_f32(65504.0), bf16::from_f32(-0.1)]);
}

#[test]
fn constructors() {
    assert_eq!(MlxArray::zeros(&[2, 3], Dtype::Int32).unwrap().to_vec::<i32>().unwrap(), vec![0; 6]);
    assert_eq!(MlxArray::ones(&[4], Dtype::Float32).unwrap().to_vec::<f32>().unwrap(), vec![1.0; 4]);
    assert_eq!(MlxArray::full(&[2], 2.5, Dtype::Float32).unwrap().to_vec::<f32>().unwrap(), vec![2.5, 2.5]);
    if backend() == Backend::Cpu {
        // float64 exists only on the CPU; its fill keeps every bit of the value.
        assert_eq!(MlxArray::full(&[1], 0.1, Dtype::Float64).unwrap().to_vec::<f64>().unwrap(), vec![0.1]);
    }
    let r = MlxArray::arange(1.0, 7.0, 2.0, Dtype::Uint32).unwrap();
    assert_eq!(r.to_vec::<u32>().unwrap(), vec![1, 3, 5]);
    let s = MlxArray::scalar(7i32).unwrap();
    assert_eq!((s.ndim(), s.size(), s.shape()), (0, 1, vec![]));
    let e = MlxArray::from_slice::<f32>(&[], &[0, 3]).unwrap();
    assert_eq!((e.size(), e.to_vec::<f32>().unwrap()), (0, vec![]));
}

fn arr(v: &[f32], shape: &[usize]) -> MlxArray {
    MlxArray::from_slice(v, shape).unwrap()
}

fn u32s(v: &[u32]) -> MlxArray {
    MlxArray::from_slice(v, &[v.len()]).unwrap()
}

#[test]
fn arithmetic_and_bit_operations() {
    let a = arr(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = arr(&[10.0, 20.0], &[2]);
    assert_eq!(a.add(&b).unwrap().to_vec::<f32>().unwrap(), vec![11.0, 22.0, 13.0, 24.0]);
    assert_eq!(a.subtract(&b).unwrap().to_vec::<f32>().unwrap(), vec![-9.0, -18.0, -7.0, -16.0]);
    assert_eq!(a.multiply(&b).unwrap().to_vec::<f32>().unwrap(), vec![10.0, 40.0, 30.0, 80.0]);
    assert_eq!(b.divide(&a).unwrap().to_vec::<f32>().unwrap(), vec![10.0, 10.0, 10.0 / 3.0, 5.0]);
    assert_eq!(a.negative().unwrap().abs().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(a.square().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 4.0, 9.0, 16.0]);
    assert_eq!(a.maximum(&arr(&[2.5], &[1])).unwrap().to_vec::<f32>().unwrap(), vec![2.5, 2.5, 3.0, 4.0]);

    let x = u32s(&[0xF0F0_F0F0, 0x0000_FFFF, 0x8000_0001]);
    let y = u32s(&[0xFF00_FF00, 0x0F0F_0F0F, 0x0000_0003]);
    assert_eq!(x.bitwise_and(&y).unwrap().to_vec::<u32>().unwrap(), vec![0xF000_F000, 0x0000_0F0F, 0x0000_0001]);
    assert_eq!(x.bitwise_or(&y).unwrap().to_vec::<u32>().unwrap(), vec![0xFFF0_FFF0, 0x0F0F_FFFF, 0x8000_0003]);
    assert_eq!(x.bitwise_xor(&y).unwrap().to_vec::<u32>().unwrap(), vec![0x0FF0_0FF0, 0x0F0F_F0F0, 0x8000_0002]);
    let sh = u32s(&[4, 16, 31]);
    assert_eq!(x.left_shift(&sh).unwrap().to_vec::<u32>().unwrap(), vec![0x0F0F_0F00, 0xFFFF_0000, 0x8000_0000]);
    // Unsigned right shifts are logical (no sign fill).
    assert_eq!(x.right_shift(&sh).unwrap().to_vec::<u32>().unwrap(), vec![0x0F0F_0F0F, 0x0000_0000, 0x0000_0001]);
}

#[test]
fn matmul_sum_cast_reshape_transpose() {
    let a = arr(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = arr(&[1.0, 0.0, -1.0, 2.0, 0.5, 1.0], &[3, 2]);
    // [1 2 3; 4 5 6] x [1 0; -1 2; 0.5 1] = [1-2+1.5, 0+4+3; 4-5+3, 0+10+6] = [0.5 7; 2 16]
    assert_eq!(a.matmul(&b).unwrap().to_vec::<f32>().unwrap(), vec![0.5, 7.0, 2.0, 16.0]);
    assert_eq!(a.sum_axes(&[1], false).unwrap().to_vec::<f32>().unwrap(), vec![6.0, 15.0]);
    let kept = a.sum_axes(&[0], true).unwrap();
    assert_eq!((kept.shape(), kept.to_vec::<f32>().unwrap()), (vec![1, 3], vec![5.0, 7.0, 9.0]));
    assert_eq!(a.sum_axes(&[-1, 0], false).unwrap().to_vec::<f32>().unwrap(), vec![21.0]);
    assert_eq!(a.sum_all(false).unwrap().item_f64().unwrap(), 21.0);
    assert_eq!(a.max_all(false).unwrap().item_f64().unwrap(), 6.0);
    assert_eq!(a.astype(Dtype::Int32).unwrap().to_vec::<i32>().unwrap(), vec![1, 2, 3, 4, 5, 6]);
    let r = a.reshape(&[3, 2]).unwrap();
    assert_eq!(r.shape(), vec![3, 2]);
    let t = a.transpose(&[1, 0]).unwrap();
    assert_eq!((t.shape(), t.to_vec::<f32>().unwrap()), (vec![3, 2], vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]));
    assert_eq!(a.t().unwrap().to_vec::<f32>().unwrap(), vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
}

#[test]
fn slicing_gathering_joining() {
    let a = MlxArray::arange(0.0, 12.0, 1.0, Dtype::Int32).unwrap().reshape(&[3, 4]).unwrap();
    let s = a.slice(&[1, 0], &[3, 4], &[1, 2]).unwrap();
    assert_eq!((s.shape(), s.to_vec::<i32>().unwrap()), (vec![2, 2], vec![4, 6, 8, 10]));
    let idx = MlxArray::from_slice(&[2u32, 0, 2], &[3]).unwrap();
    assert_eq!(a.take(&idx, 0).unwrap().to_vec::<i32>().unwrap(), vec![8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11]);
    assert_eq!(a.take(&idx, -1).unwrap().to_vec::<i32>().unwrap(), vec![2, 0, 2, 6, 4, 6, 10, 8, 10]);
    let c = concatenate(&[&s, &s], 1).unwrap();
    assert_eq!((c.shape(), c.to_vec::<i32>().unwrap()), (vec![2, 4], vec![4, 6, 4, 6, 8, 10, 8, 10]));
    let copy = a.deep_copy().unwrap();
    assert_eq!(copy.to_vec::<i32>().unwrap(), a.to_vec::<i32>().unwrap());
}

#[test]
fn random_is_seeded_and_allclose_compares() {
    let a = random::normal(&[1000], Dtype::Float32, 0.0, 1.0, 7).unwrap();
    let b = random::normal(&[1000], Dtype::Float32, 0.0, 1.0, 7).unwrap();
    let c = random::normal(&[1000], Dtype::Float32, 0.0, 1.0, 8).unwrap();
    assert!(a.allclose(&b, 0.0, 0.0).unwrap());
    assert!(!a.allclose(&c, 1e-5, 1e-5).unwrap());
    let v = a.to_vec::<f32>().unwrap();
    let mean = v.iter().sum::<f32>() / 1000.0;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / 1000.0;
    assert!(mean.abs() < 0.15 && (var - 1.0).abs() < 0.2, "mean {mean} var {var}");
    let u = random::uniform(&[1000], Dtype::Float32, 2.0, 3.0, 1).unwrap().to_vec::<f32>().unwrap();
    assert!(u.iter().all(|&x| (2.0..3.0).contains(&x)));
    assert!(arr(&[1.0, 2.0], &[2]).allclose(&arr(&[1.0, 2.0000001], &[2]), 1e-5, 0.0).unwrap());
}

#[test]
fn affine_quantized_matmul_matches_its_dequantized_weights() {
    let w = random::normal(&[64, 128], Dtype::Float32, 0.0, 1.0, 3).unwrap();
    let x = random::normal(&[2, 128], Dtype::Float32, 0.0, 1.0, 4).unwrap();
    let (q, s, b) = quantize(&w, 64, 4).unwrap();
    assert_eq!(q.dtype(), Dtype::Uint32);
    assert_eq!(q.shape(), vec![64, 128 * 4 / 32]);
    assert_eq!(s.shape(), vec![64, 2]);
    let y = quantized_matmul(&x, &q, &s, &b, true, 64, 4).unwrap();
    let wd = mlx_trellis::dequantize(&q, &s, &b, 64, 4).unwrap();
    // x · wdᵀ in f64 on the host.
    let (xv, wv) = (x.to_vec::<f32>().unwrap(), wd.to_vec::<f32>().unwrap());
    let y_ref: Vec<f64> = (0..2 * 64)
        .map(|i| (0..128).map(|j| f64::from(xv[i / 64 * 128 + j]) * f64::from(wv[i % 64 * 128 + j])).sum())
        .collect();
    let y: Vec<f64> = y.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect();
    let err = rel_err(&y, &y_ref).unwrap();
    println!("quantized_matmul against x · dequantized(w)ᵀ in f64: relErr {err:.2e}");
    // MLX's quantized matmul accumulates in f32 on every back-end, TF32 or not (1.1e-7 on the
    // H200 with TF32 on).
    assert!(err < 1e-5, "quantized_matmul relErr {err:.3e} against x · dequantized(w)ᵀ in f64");
    // And 4-bit weights are near the originals (max error half a step of the 4-bit grid).
    let err = wd.subtract(&w).unwrap().abs().unwrap().max_all(false).unwrap().item_f64().unwrap();
    assert!(err < 0.6, "dequantization error {err}");
}

fn mlx_message(err: &mlx_trellis::Error) -> String {
    assert_eq!(err.kind(), ErrorKind::Mlx, "{err}");
    assert!(matches!(err.root(), mlx_trellis::Error::Mlx { .. }), "{err}");
    err.message()
}

#[test]
fn mlx_errors_are_values_and_the_process_survives() {
    let a = arr(&[1.0, 2.0, 3.0], &[3]);
    let b = arr(&[1.0, 2.0], &[2]);
    let err = a.add(&b).unwrap_err();
    assert!(mlx_message(&err).contains("broadcast"), "{err:#}");
    let err = a.reshape(&[2, 2]).unwrap_err();
    assert!(mlx_message(&err).contains("reshape"), "{err:#}");
    let err = a.matmul(&b).unwrap_err();
    assert!(!mlx_message(&err).is_empty());
    // Still working after the errors.
    assert_eq!(a.add(&a).unwrap().to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
}

#[test]
fn misuse_is_caught_with_clear_messages() {
    let err = MlxArray::from_slice(&[1.0f32, 2.0], &[3]).unwrap_err();
    assert!(err.to_string().contains("2 elements do not fill shape [3]"), "{err}");
    let a = arr(&[1.0], &[1]);
    let err = a.to_vec::<i32>().unwrap_err();
    assert!(err.to_string().contains("cannot read a float32 array as int32"), "{err}");
    let err = a.sum_axes(&[1], false).unwrap_err();
    assert!(err.to_string().contains("axis 1 is out of range"), "{err}");
    let err = a.slice(&[0, 0], &[1, 1], &[1, 1]).unwrap_err();
    assert!(err.to_string().contains("one entry per dimension"), "{err}");
    let err = arr(&[1.0, 2.0], &[2]).item_f64().unwrap_err();
    assert!(err.to_string().contains("item of an array with 2 elements"), "{err}");
    let err = MlxArray::arange(0.0, 1.0, 0.0, Dtype::Float32).unwrap_err();
    assert!(err.to_string().contains("step"), "{err}");
}

#[test]
fn evaluated_arrays_are_readable_from_other_threads() {
    let values: Vec<f32> = (0..1024).map(|i| i as f32 * 0.5).collect();
    let a = MlxArray::from_slice(&values, &[32, 32]).unwrap();
    let doubled = a.add(&a).unwrap().share().unwrap();
    let shared = std::sync::Arc::new(doubled);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let s = shared.clone();
            std::thread::spawn(move || {
                // Reading works anywhere; using it in new operations works on the reading thread.
                let v = s.to_vec::<f32>().unwrap();
                let again = s.to_array().sum_all(false).unwrap().item_f64().unwrap();
                (v, again)
            })
        })
        .collect();
    let expected: Vec<f32> = values.iter().map(|v| v * 2.0).collect();
    let total: f64 = expected.iter().map(|&v| v as f64).sum();
    for h in handles {
        let (v, sum) = h.join().unwrap();
        assert_eq!(v, expected);
        assert_eq!(sum, total);
    }
}

#[test]
fn safetensors_round_trip() {
    let dir = std::env::temp_dir().join(format!("mlx-trellis-io-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.safetensors");
    let codes = MlxArray::from_slice(&[1u32, 2, 3, 0xFFFF_FFFF], &[2, 2]).unwrap();
    let scales = MlxArray::from_slice(&[f16::from_f32(0.5), f16::from_f32(-2.0)], &[2]).unwrap();
    let meta = BTreeMap::from([("format".to_string(), "mlx".to_string())]);
    save_safetensors(&path, [("a.weight", &codes), ("a.scales", &scales)], &meta).unwrap();
    let loaded = load_safetensors(&path).unwrap();
    assert_eq!(loaded.metadata.get("format").map(String::as_str), Some("mlx"));
    assert_eq!(loaded.tensors["a.weight"].to_vec::<u32>().unwrap(), vec![1, 2, 3, 0xFFFF_FFFF]);
    assert_eq!(loaded.tensors["a.scales"].to_vec::<f16>().unwrap(), vec![f16::from_f32(0.5), f16::from_f32(-2.0)]);

    // A truncated file is an error that names the file.
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 5]).unwrap();
    let err = load_safetensors(&cut).unwrap_err();
    assert!(format!("{err:#}").contains("cut.safetensors"), "{err:#}");
    assert_eq!(err.kind(), mlx_trellis::ErrorKind::Artifact, "{err:#}");
    // A missing file is the operating system's error, naming the file.
    let err = load_safetensors(dir.join("missing.safetensors")).unwrap_err();
    assert_eq!(err.kind(), mlx_trellis::ErrorKind::Io, "{err:#}");
    let text = format!("{err:#}");
    assert!(text.contains("missing.safetensors") && text.to_lowercase().contains("no such file"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn backend_is_detected_consistently() {
    let b = backend();
    println!("backend: {b}");
    // A GPU device is usable exactly when the build has a GPU back-end.
    assert_eq!(mlx_trellis::Device::gpu().is_available(), b != Backend::Cpu);
    assert_eq!(mlx_trellis::Device::cpu().device_type(), mlx_trellis::DeviceType::Cpu);
}

#[test]
fn max_over_axes_matches_the_host() {
    let v = [1.0f32, 5.0, -2.0, 4.0, -7.0, 3.0, 0.5, 9.0, -1.0, 2.0, 2.0, -8.0];
    let a = arr(&v, &[2, 2, 3]);
    // The host's maxima of [2, 2, 3] over the last axis, the first, and both.
    let at = |i: usize, j: usize, k: usize| v[i * 6 + j * 3 + k];
    let over_last: Vec<f32> =
        (0..4).map(|ij| (0..3).map(|k| at(ij / 2, ij % 2, k)).fold(f32::NEG_INFINITY, f32::max)).collect();
    let over_first: Vec<f32> = (0..6).map(|jk| at(0, jk / 3, jk % 3).max(at(1, jk / 3, jk % 3))).collect();
    let over_two: Vec<f32> = (0..2)
        .map(|j| {
            (0..2).flat_map(|i| (0..3).map(move |k| (i, k))).map(|(i, k)| at(i, j, k)).fold(f32::NEG_INFINITY, f32::max)
        })
        .collect();
    let m = a.max_axes(&[2], false).unwrap();
    assert_eq!((m.shape(), m.to_vec::<f32>().unwrap()), (vec![2, 2], over_last));
    let m = a.max_axes(&[0], true).unwrap();
    assert_eq!((m.shape(), m.to_vec::<f32>().unwrap()), (vec![1, 2, 3], over_first));
    let m = a.max_axes(&[-1, 0], false).unwrap();
    assert_eq!((m.shape(), m.to_vec::<f32>().unwrap()), (vec![2], over_two));
    let e = a.max_axes(&[3], false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("axis 3 is out of range for an array of 3 dimensions"), "{e}");
}

#[test]
fn broadcast_to_repeats_along_the_new_and_unit_axes() {
    let row = arr(&[10.0, 20.0, 30.0], &[3]);
    let b = row.broadcast_to(&[2, 3]).unwrap();
    assert_eq!((b.shape(), b.to_vec::<f32>().unwrap()), (vec![2, 3], [10.0, 20.0, 30.0].repeat(2)));
    let col = arr(&[1.0, 2.0], &[2, 1]);
    let c = col.broadcast_to(&[2, 3]).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    // A dimension of 3 does not stretch to 4: MLX refuses, and the error is a value.
    let e = row.broadcast_to(&[2, 4]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Mlx, "{e}");
}

#[test]
fn where_chooses_elementwise_with_broadcasting() {
    let a = [1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0];
    let other = [0.5f32, 7.0, -9.0];
    let cond: Vec<bool> = a.iter().map(|&v| v > 0.0).collect();
    // The host's choice, `other` broadcast along the rows of [2, 3].
    let want: Vec<f32> = a.iter().enumerate().map(|(i, &v)| if cond[i] { v } else { other[i % 3] }).collect();
    let got = arr(&a, &[2, 3]).where_(&MlxArray::from_slice(&cond, &[2, 3]).unwrap(), &arr(&other, &[3])).unwrap();
    assert_eq!((got.shape(), got.to_vec::<f32>().unwrap()), (vec![2, 3], want));
    // A scalar condition chooses whole arrays.
    let all = arr(&a, &[2, 3]).where_(&MlxArray::scalar(false).unwrap(), &arr(&other, &[3])).unwrap();
    assert_eq!(all.to_vec::<f32>().unwrap(), [other, other].concat());
}

#[test]
fn the_default_device_can_be_set_and_this_threads_streams_follow_it() {
    // The default is set to the device it already is, so that the tests running beside this one
    // keep theirs; the thread's cached default stream is renewed from it.
    let before = mlx_trellis::Device::default_device().unwrap();
    let same = match before.device_type() {
        mlx_trellis::DeviceType::Gpu => mlx_trellis::Device::gpu(),
        mlx_trellis::DeviceType::Cpu => mlx_trellis::Device::cpu(),
    };
    same.set_default().unwrap();
    assert_eq!(mlx_trellis::Device::default_device().unwrap().device_type(), before.device_type());
    assert_eq!(Stream::current().unwrap().device_type(), before.device_type());
    if backend() == Backend::Cpu {
        // MLX refuses a GPU default on a build without one, and the default stays the CPU.
        let e = mlx_trellis::Device::gpu().set_default().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Mlx, "{e}");
        assert_eq!(mlx_trellis::Device::default_device().unwrap().device_type(), mlx_trellis::DeviceType::Cpu);
    }
}

/// Set in the process that `an_exit_after_the_exit_handler_keeps_its_status_and_output` starts.
const EXIT_CHILD: &str = "MLX_TRELLIS_TEST_EXIT_CHILD";

/// An exit handler that aborts, as the destructors of MLX's CUDA objects do when they run after
/// the driver has begun to shut down.
extern "C" fn abort_at_exit() {
    std::process::abort()
}

/// `skip_static_destructors_at_exit` (Linux with glibc, where it registers its handler): an exit
/// after it keeps the status `exit` was given, though a handler registered before it would abort,
/// and output still in Rust's buffer reaches the pipe. The test starts this test binary again as
/// the process that exits.
#[test]
#[cfg_attr(
    not(all(target_os = "linux", target_env = "gnu")),
    ignore = "the exit handler is registered on Linux with glibc only"
)]
fn an_exit_after_the_exit_handler_keeps_its_status_and_output() {
    if std::env::var_os(EXIT_CHILD).is_some() {
        MlxArray::from_slice(&[1.0f32, 2.0], &[2]).unwrap().eval().unwrap();
        // SAFETY: `abort_at_exit` is a valid handler for the whole process.
        assert_eq!(unsafe { libc::atexit(abort_at_exit) }, 0);
        mlx_trellis::skip_static_destructors_at_exit();
        print!("a line without its newline");
        std::process::exit(7);
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "an_exit_after_the_exit_handler_keeps_its_status_and_output", "--nocapture"])
        .env(EXIT_CHILD, "1")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(7),
        "the child ended with {}; its stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("a line without its newline"));
}
