//! The scalar/vector part of the supported MSL subset: vector types, math,
//! integer bit functions, limits, bit casts and 16-bit literals.

use msl_sim::{f16_bits_to_f32, run, HostTensor, KernelDesc, Launch, ScalarType};

#[test]
fn vectors_math_bits_and_limits() {
    let desc = KernelDesc::new(
        "subset",
        &["x"],
        &["f", "u"],
        r#"
  const float a = x[0];  // 2.5
  const float b = x[1];  // -0.75
  // Vectors: construction, components, elementwise arithmetic, conversion.
  float4 v = float4(a, b, 1.0f, 2.0f);
  v = v * 2.0f + float4(1.0f);
  half2 h = half2(v.x, v.y);
  const float2 hv = float2(h) / 2;
  uint3 p = uint3(1, 2, 3) * 4u;
  int2 q = int2(-3, 5);
  f[0] = v.x; f[1] = v.y; f[2] = v.z; f[3] = v.w;
  f[4] = hv.x + hv.y;
  f[5] = dot(float2(a, b), float2(2.0f, 4.0f));
  // Math (the precise:: and fast:: variants map to the same functions).
  f[6] = metal::exp(0.0f) + exp2(3.0f) + log(1.0f) + sqrt(16.0f) + rsqrt(4.0f);
  f[7] = floor(b) + ceil(b) + abs(b) + fabs(-a);
  f[8] = clamp(a, 0.0f, 1.0f) + select(1.0f, 2.0f, a > b) + min(a, b) + max(a, b);
  f[9] = metal::precise::exp(1.0f) - metal::fast::exp(1.0f);
  f[10] = fma(a, b, 1.0f);
  f[11] = numeric_limits<float>::max() == FLT_MAX ? 1.0f : 0.0f;
  f[12] = float(numeric_limits<half>::max());
  f[13] = isinf(numeric_limits<float>::infinity()) && isnan(NAN) ? 1.0f : 0.0f;
  f[14] = float(0.5h + 1.25h);
  f[15] = as_type<float>(0x40490fdbu);
  f[16] = float(abs(q).x + q.y) + float(p.z);
  f[17] = float(half(a) * half(b));
  // Integer bit functions.
  const uint w = as_type<uint>(x[2]);  // 1.0f = 0x3f800000
  u[0] = popcount(w);
  u[1] = clz(w);
  u[2] = ctz(w);
  u[3] = extract_bits(w, 23u, 8u);
  u[4] = uint(extract_bits(int(0xf0), 4u, 4u));  // sign-extended 4-bit 0xf = -1
  u[5] = insert_bits(0u, 0x5u, 4u, 3u);
  u[6] = reverse_bits(1u);
  u[7] = min(7u, 3u) + max(7u, 3u) + clamp(10u, 2u, 5u);
  u[8] = as_type<ushort2>(w).y;
  u[9] = uint(int(-2.7f)) + (uint)(ushort)half(3.0f);
"#,
    );
    let launch = Launch::new(vec![(vec![18], ScalarType::F32), (vec![10], ScalarType::U32)], [1, 1, 1], [1, 1, 1]);
    let out = run(&desc, &[HostTensor::from_f32(&[3], &[2.5, -0.75, 1.0])], &launch).unwrap();
    let f = out[0].to_f32_vec();
    let u = out[1].to_u32_vec();
    let (a, b) = (2.5f32, -0.75f32);
    assert_eq!(&f[0..4], &[a * 2.0 + 1.0, b * 2.0 + 1.0, 3.0, 5.0]);
    assert_eq!(f[4], (6.0 - 0.5) / 2.0);
    assert_eq!(f[5], a * 2.0 + b * 4.0);
    assert_eq!(f[6], 1.0 + 8.0 + 0.0 + 4.0 + 0.5);
    assert_eq!(f[7], -1.0 + 0.0 + 0.75 + 2.5);
    assert_eq!(f[8], 1.0 + 2.0 + b + a);
    assert_eq!(f[9], 0.0);
    assert_eq!(f[10], a.mul_add(b, 1.0));
    assert_eq!(f[11], 1.0);
    assert_eq!(f[12], 65504.0);
    assert_eq!(f[13], 1.0);
    assert_eq!(f[14], 1.75);
    assert_eq!(f[15], std::f32::consts::PI);
    assert_eq!(f[16], (3 + 5 + 12) as f32);
    assert_eq!(f[17], f16_bits_to_f32(msl_sim::f32_to_f16_bits(a * b)));
    assert_eq!(u[0], 7);
    assert_eq!(u[1], 2);
    assert_eq!(u[2], 23);
    assert_eq!(u[3], 127);
    assert_eq!(u[4], u32::MAX);
    assert_eq!(u[5], 0x50);
    assert_eq!(u[6], 0x8000_0000);
    assert_eq!(u[7], 3 + 7 + 5);
    assert_eq!(u[8], 0x3f80);
    assert_eq!(u[9], (-2i32 as u32).wrapping_add(3));
}
