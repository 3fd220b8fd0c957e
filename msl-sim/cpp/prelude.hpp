// msl-sim prelude: the subset of the Metal Shading Language (MSL) standard
// library that the simulated kernels may use, written in portable C++17.
//
// This text is pasted at the top of every generated translation unit. It must
// not include headers that declare C math functions in the global namespace
// (<cmath>, <math.h>, <cstdlib>): a kernel that calls a function this prelude
// does not provide must fail to compile instead of silently binding to a libc
// function with different types or precision.
//
// Conventions:
// * Everything an MSL kernel can name lives in namespace `metal`; the kernel
//   text is placed in a namespace that has `using namespace metal;`.
// * SIMD-group and threadgroup operations call into the runtime
//   (namespace `msl_sim_rt`, defined after the kernel) which runs all threads
//   of a threadgroup as cooperative fibers.
// * Features that are deliberately not supported are declared with a
//   static_assert that names them, so they fail to compile with a clear message.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#define MSL_SIM_INLINE inline __attribute__((always_inline))

// Source location of a SIMD-group/threadgroup operation, captured at the call
// site through default arguments. It is used to check that all lanes reach the
// same operation and to name it in error messages.
// The column (where the compiler provides it) tells apart two operations on
// one line; it is compared but not printed.
#if defined(__has_builtin)
#if __has_builtin(__builtin_COLUMN)
#define MSL_SIM_COLUMN() __builtin_COLUMN()
#endif
#endif
#ifndef MSL_SIM_COLUMN
#define MSL_SIM_COLUMN() 0
#endif
#define MSL_SIM_LOC_PARAMS                                                      \
  const char *msl_sim_file_ = __builtin_FILE(),                                \
             int msl_sim_line_ = __builtin_LINE(), int msl_sim_col_ = MSL_SIM_COLUMN()
#define MSL_SIM_LOC msl_sim_file_, msl_sim_line_, msl_sim_col_

// ---------------------------------------------------------------------------
// Scalar type names. These are global typedefs (glibc may declare the same
// ones in <sys/types.h>; identical typedef redeclarations are legal).
// ---------------------------------------------------------------------------
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

namespace metal {
struct half;
struct bfloat;
} // namespace metal

namespace msl_sim_detail {

constexpr uint32_t f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
constexpr float f32_from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }

// IEEE binary32 -> binary16, round to nearest, ties to even. NaN payloads are
// truncated but kept quiet; overflow goes to infinity.
constexpr uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) { // inf or NaN
    return uint16_t(sign | 0x7c00u | (a > 0x7f800000u ? (0x200u | ((a >> 13) & 0x3ffu)) : 0u));
  }
  if (a >= 0x47800000u) return uint16_t(sign | 0x7c00u); // >= 2^16: overflow
  if (a < 0x38800000u) {                                   // below 2^-14: subnormal half
    if (a < 0x33000000u) return uint16_t(sign);            // <= 2^-25 rounds to zero
    const uint32_t e = a >> 23;
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e; // 14..24
    uint32_t k = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    if (rem > halfway || (rem == halfway && (k & 1u))) ++k;
    return uint16_t(sign | k);
  }
  const uint32_t r = a - 0x38000000u; // rebias the exponent from 127 to 15
  uint32_t h = r >> 13;
  const uint32_t rem = r & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h; // carry may reach inf: correct
  return uint16_t(sign | h);
}

constexpr float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = float(m) * 0x1p-24f; // exact
    return sign ? -v : v;
  }
  if (e == 31) return f32_from_bits(sign | 0x7f800000u | (m << 13));
  return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

// binary32 -> bfloat16, round to nearest, ties to even; NaN stays quiet NaN.
constexpr uint16_t f32_to_bf16(float f) {
  const uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

constexpr float bf16_to_f32(uint16_t b) { return f32_from_bits(uint32_t(b) << 16); }

template <class T> struct is_f16like : std::false_type {};
template <> struct is_f16like<metal::half> : std::true_type {};
template <> struct is_f16like<metal::bfloat> : std::true_type {};

// Scalar types that may be broadcast into a vector or mixed with half/bfloat.
template <class T>
struct is_scalar
    : std::integral_constant<bool, std::is_arithmetic<T>::value || is_f16like<T>::value> {};

template <class... A> struct dependent_false : std::false_type {};

} // namespace msl_sim_detail

namespace metal {

// ---------------------------------------------------------------------------
// half and bfloat: 16-bit storage types. Every arithmetic operation between
// two values of the type is done in float and rounded back to the type
// (round to nearest even), as Metal does per operation. For +, -, *, / float
// has enough precision that this double rounding gives the correctly rounded
// 16-bit result. Mixing with float gives float; mixing with an integer gives
// the 16-bit type. Conversion to float is implicit; conversion to integers and
// bool is explicit (a cast), which keeps `cond ? h : 0` well formed.
// ---------------------------------------------------------------------------
#define MSL_SIM_F16LIKE(NAME, TO_BITS, FROM_BITS)                                 \
  struct NAME {                                                                 \
    uint16_t bits_;                                                             \
    NAME() = default;                                                           \
    constexpr NAME(float f) : bits_(msl_sim_detail::TO_BITS(f)) {}              \
    constexpr NAME(double d) : bits_(msl_sim_detail::TO_BITS(float(d))) {}      \
    template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>   \
    constexpr NAME(I i) : bits_(msl_sim_detail::TO_BITS(float(i))) {}           \
    template <class F, std::enable_if_t<std::is_same<F, float>::value, int> = 0> \
    constexpr operator F() const { return msl_sim_detail::FROM_BITS(bits_); }   \
    template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>   \
    constexpr explicit operator I() const {                                     \
      return I(msl_sim_detail::FROM_BITS(bits_));                               \
    }                                                                           \
    static constexpr NAME from_bits(uint16_t b) {                               \
      NAME r{};                                                                 \
      r.bits_ = b;                                                              \
      return r;                                                                 \
    }                                                                           \
  };

MSL_SIM_F16LIKE(half, f32_to_f16, f16_to_f32)
MSL_SIM_F16LIKE(bfloat, f32_to_bf16, bf16_to_f32)
#undef MSL_SIM_F16LIKE

constexpr half operator""h(long double v) { return half(float(v)); }
constexpr half operator""h(unsigned long long v) { return half(float(v)); }

#define MSL_SIM_F16_OPS(H)                                                                    \
  constexpr H operator-(H a) { return H::from_bits(uint16_t(a.bits_ ^ 0x8000u)); }            \
  constexpr H operator+(H a) { return a; }                                                    \
  MSL_SIM_F16_BINOP(H, +)                                                                     \
  MSL_SIM_F16_BINOP(H, -)                                                                     \
  MSL_SIM_F16_BINOP(H, *)                                                                     \
  MSL_SIM_F16_BINOP(H, /)                                                                     \
  MSL_SIM_F16_CMP(H, ==)                                                                      \
  MSL_SIM_F16_CMP(H, !=)                                                                      \
  MSL_SIM_F16_CMP(H, <)                                                                       \
  MSL_SIM_F16_CMP(H, <=)                                                                      \
  MSL_SIM_F16_CMP(H, >)                                                                       \
  MSL_SIM_F16_CMP(H, >=)                                                                      \
  MSL_SIM_F16_ASSIGN(H, +)                                                                    \
  MSL_SIM_F16_ASSIGN(H, -)                                                                    \
  MSL_SIM_F16_ASSIGN(H, *)                                                                    \
  MSL_SIM_F16_ASSIGN(H, /)                                                                    \
  constexpr H &operator++(H &a) { return a = H(float(a) + 1.0f); }                            \
  constexpr H &operator--(H &a) { return a = H(float(a) - 1.0f); }                            \
  constexpr H operator++(H &a, int) { H o = a; a = H(float(a) + 1.0f); return o; }           \
  constexpr H operator--(H &a, int) { H o = a; a = H(float(a) - 1.0f); return o; }

#define MSL_SIM_F16_BINOP(H, op)                                                              \
  constexpr H operator op(H a, H b) { return H(float(a) op float(b)); }                       \
  template <class U, std::enable_if_t<std::is_floating_point<U>::value, int> = 0>             \
  constexpr float operator op(H a, U b) { return float(a) op float(b); }                      \
  template <class U, std::enable_if_t<std::is_floating_point<U>::value, int> = 0>             \
  constexpr float operator op(U a, H b) { return float(a) op float(b); }                      \
  template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>                   \
  constexpr H operator op(H a, I b) { return H(float(a) op float(b)); }                       \
  template <class I, std::enable_if_t<std::is_integral<I>::value, int> = 0>                   \
  constexpr H operator op(I a, H b) { return H(float(a) op float(b)); }

#define MSL_SIM_F16_CMP(H, op)                                                                \
  constexpr bool operator op(H a, H b) { return float(a) op float(b); }                       \
  template <class U, std::enable_if_t<std::is_arithmetic<U>::value, int> = 0>                 \
  constexpr bool operator op(H a, U b) { return float(a) op float(b); }                       \
  template <class U, std::enable_if_t<std::is_arithmetic<U>::value, int> = 0>                 \
  constexpr bool operator op(U a, H b) { return float(a) op float(b); }

#define MSL_SIM_F16_ASSIGN(H, op)                                                             \
  template <class U, std::enable_if_t<msl_sim_detail::is_scalar<U>::value, int> = 0>          \
  constexpr H &operator op##=(H & a, U b) { return a = H(a op b); }                           \
  template <class A, std::enable_if_t<std::is_arithmetic<A>::value, int> = 0>                 \
  constexpr A &operator op##=(A & a, H b) { return a = A(a op b); }

MSL_SIM_F16_OPS(half)
MSL_SIM_F16_OPS(bfloat)
#undef MSL_SIM_F16_OPS
#undef MSL_SIM_F16_BINOP
#undef MSL_SIM_F16_CMP
#undef MSL_SIM_F16_ASSIGN

// half and bfloat mixed: computed in float (like two different float types).
#define MSL_SIM_MIXED(op)                                                       \
  constexpr float operator op(half a, bfloat b) { return float(a) op float(b); } \
  constexpr float operator op(bfloat a, half b) { return float(a) op float(b); }
MSL_SIM_MIXED(+)
MSL_SIM_MIXED(-)
MSL_SIM_MIXED(*)
MSL_SIM_MIXED(/)
#undef MSL_SIM_MIXED

typedef half float16_t;
typedef bfloat bfloat16_t;

// ---------------------------------------------------------------------------
// Vector types vec<T, N> (N = 2, 3, 4) with .x .y .z .w, indexing, and
// elementwise arithmetic. Conversions between vector types are explicit, as
// in MSL. Swizzles (.xy, .xyz, ...) are not supported.
// ---------------------------------------------------------------------------
template <class T, int N> struct vec;

template <class T> struct alignas(2 * sizeof(T)) vec<T, 2> {
  T x, y;
  vec() = default;
  template <class S, std::enable_if_t<msl_sim_detail::is_scalar<S>::value, int> = 0>
  constexpr vec(S s) : x(T(s)), y(T(s)) {}
  template <class A, class B> constexpr vec(A a, B b) : x(T(a)), y(T(b)) {}
  template <class U> constexpr explicit vec(const vec<U, 2> &o) : x(T(o.x)), y(T(o.y)) {}
  constexpr T &operator[](int i) { return i == 0 ? x : y; }
  constexpr const T &operator[](int i) const { return i == 0 ? x : y; }
};

// Like Metal, a 3-vector occupies the space of a 4-vector.
template <class T> struct alignas(4 * sizeof(T)) vec<T, 3> {
  T x, y, z;
  vec() = default;
  template <class S, std::enable_if_t<msl_sim_detail::is_scalar<S>::value, int> = 0>
  constexpr vec(S s) : x(T(s)), y(T(s)), z(T(s)) {}
  template <class A, class B, class C>
  constexpr vec(A a, B b, C c) : x(T(a)), y(T(b)), z(T(c)) {}
  template <class B> constexpr vec(const vec<T, 2> &a, B b) : x(a.x), y(a.y), z(T(b)) {}
  template <class U>
  constexpr explicit vec(const vec<U, 3> &o) : x(T(o.x)), y(T(o.y)), z(T(o.z)) {}
  constexpr T &operator[](int i) { return i == 0 ? x : (i == 1 ? y : z); }
  constexpr const T &operator[](int i) const { return i == 0 ? x : (i == 1 ? y : z); }
};

template <class T> struct alignas(4 * sizeof(T)) vec<T, 4> {
  T x, y, z, w;
  vec() = default;
  template <class S, std::enable_if_t<msl_sim_detail::is_scalar<S>::value, int> = 0>
  constexpr vec(S s) : x(T(s)), y(T(s)), z(T(s)), w(T(s)) {}
  template <class A, class B, class C, class D>
  constexpr vec(A a, B b, C c, D d) : x(T(a)), y(T(b)), z(T(c)), w(T(d)) {}
  constexpr vec(const vec<T, 2> &a, const vec<T, 2> &b) : x(a.x), y(a.y), z(b.x), w(b.y) {}
  template <class C, class D>
  constexpr vec(const vec<T, 2> &a, C c, D d) : x(a.x), y(a.y), z(T(c)), w(T(d)) {}
  template <class D> constexpr vec(const vec<T, 3> &a, D d) : x(a.x), y(a.y), z(a.z), w(T(d)) {}
  template <class U>
  constexpr explicit vec(const vec<U, 4> &o) : x(T(o.x)), y(T(o.y)), z(T(o.z)), w(T(o.w)) {}
  constexpr T &operator[](int i) { return i == 0 ? x : (i == 1 ? y : (i == 2 ? z : w)); }
  constexpr const T &operator[](int i) const {
    return i == 0 ? x : (i == 1 ? y : (i == 2 ? z : w));
  }
};

#define MSL_SIM_VEC_BINOP(op)                                                            \
  template <class T, int N>                                                              \
  constexpr vec<T, N> operator op(const vec<T, N> &a, const vec<T, N> &b) {              \
    vec<T, N> r{};                                                                       \
    for (int i = 0; i < N; ++i) r[i] = T(a[i] op b[i]);                                  \
    return r;                                                                            \
  }                                                                                      \
  template <class T, int N, class S,                                                     \
            std::enable_if_t<msl_sim_detail::is_scalar<S>::value, int> = 0>              \
  constexpr vec<T, N> operator op(const vec<T, N> &a, S b) {                             \
    vec<T, N> r{};                                                                       \
    for (int i = 0; i < N; ++i) r[i] = T(a[i] op T(b));                                  \
    return r;                                                                            \
  }                                                                                      \
  template <class T, int N, class S,                                                     \
            std::enable_if_t<msl_sim_detail::is_scalar<S>::value, int> = 0>              \
  constexpr vec<T, N> operator op(S a, const vec<T, N> &b) {                             \
    vec<T, N> r{};                                                                       \
    for (int i = 0; i < N; ++i) r[i] = T(T(a) op b[i]);                                  \
    return r;                                                                            \
  }                                                                                      \
  template <class T, int N, class R>                                                     \
  constexpr vec<T, N> &operator op##=(vec<T, N> &a, const R &b) {                        \
    a = a op b;                                                                          \
    return a;                                                                            \
  }
MSL_SIM_VEC_BINOP(+)
MSL_SIM_VEC_BINOP(-)
MSL_SIM_VEC_BINOP(*)
MSL_SIM_VEC_BINOP(/)
MSL_SIM_VEC_BINOP(%)
MSL_SIM_VEC_BINOP(&)
MSL_SIM_VEC_BINOP(|)
MSL_SIM_VEC_BINOP(^)
MSL_SIM_VEC_BINOP(<<)
MSL_SIM_VEC_BINOP(>>)
#undef MSL_SIM_VEC_BINOP

#define MSL_SIM_VEC_CMP(op)                                                              \
  template <class T, int N>                                                              \
  constexpr vec<bool, N> operator op(const vec<T, N> &a, const vec<T, N> &b) {           \
    vec<bool, N> r{};                                                                    \
    for (int i = 0; i < N; ++i) r[i] = bool(a[i] op b[i]);                               \
    return r;                                                                            \
  }                                                                                      \
  template <class T, int N, class S,                                                     \
            std::enable_if_t<msl_sim_detail::is_scalar<S>::value, int> = 0>              \
  constexpr vec<bool, N> operator op(const vec<T, N> &a, S b) {                          \
    vec<bool, N> r{};                                                                    \
    for (int i = 0; i < N; ++i) r[i] = bool(a[i] op T(b));                               \
    return r;                                                                            \
  }
MSL_SIM_VEC_CMP(==)
MSL_SIM_VEC_CMP(!=)
MSL_SIM_VEC_CMP(<)
MSL_SIM_VEC_CMP(<=)
MSL_SIM_VEC_CMP(>)
MSL_SIM_VEC_CMP(>=)
MSL_SIM_VEC_CMP(&&)
MSL_SIM_VEC_CMP(||)
#undef MSL_SIM_VEC_CMP

template <class T, int N> constexpr vec<T, N> operator-(const vec<T, N> &a) {
  vec<T, N> r{};
  for (int i = 0; i < N; ++i) r[i] = T(-a[i]);
  return r;
}
template <class T, int N> constexpr vec<T, N> operator+(const vec<T, N> &a) { return a; }
template <class T, int N> constexpr vec<T, N> operator~(const vec<T, N> &a) {
  vec<T, N> r{};
  for (int i = 0; i < N; ++i) r[i] = T(~a[i]);
  return r;
}
template <class T, int N> constexpr vec<bool, N> operator!(const vec<T, N> &a) {
  vec<bool, N> r{};
  for (int i = 0; i < N; ++i) r[i] = !bool(a[i]);
  return r;
}
template <int N> constexpr bool all(const vec<bool, N> &v) {
  for (int i = 0; i < N; ++i)
    if (!v[i]) return false;
  return true;
}
template <int N> constexpr bool any(const vec<bool, N> &v) {
  for (int i = 0; i < N; ++i)
    if (v[i]) return true;
  return false;
}
constexpr bool all(bool b) { return b; }
constexpr bool any(bool b) { return b; }

#define MSL_SIM_VEC_TYPEDEFS(T, NAME)                                           \
  typedef vec<T, 2> NAME##2;                                                    \
  typedef vec<T, 3> NAME##3;                                                    \
  typedef vec<T, 4> NAME##4;
MSL_SIM_VEC_TYPEDEFS(bool, bool)
MSL_SIM_VEC_TYPEDEFS(char, char)
MSL_SIM_VEC_TYPEDEFS(uchar, uchar)
MSL_SIM_VEC_TYPEDEFS(short, short)
MSL_SIM_VEC_TYPEDEFS(ushort, ushort)
MSL_SIM_VEC_TYPEDEFS(int, int)
MSL_SIM_VEC_TYPEDEFS(uint, uint)
MSL_SIM_VEC_TYPEDEFS(long, long)
MSL_SIM_VEC_TYPEDEFS(ulong, ulong)
MSL_SIM_VEC_TYPEDEFS(half, half)
MSL_SIM_VEC_TYPEDEFS(bfloat, bfloat)
MSL_SIM_VEC_TYPEDEFS(float, float)
#undef MSL_SIM_VEC_TYPEDEFS

// ---------------------------------------------------------------------------
// Bit casts.
// ---------------------------------------------------------------------------
template <class To, class From> MSL_SIM_INLINE constexpr To as_type(const From &v) {
  static_assert(sizeof(To) == sizeof(From), "as_type<T>(v) requires sizeof(T) == sizeof(v)");
  return __builtin_bit_cast(To, v);
}

// ---------------------------------------------------------------------------
// Math. Float functions use the host libm (through GCC builtins), so results
// can differ from Metal's in the last bits (Metal's default fast-math variants
// are less accurate). half and bfloat versions compute in float and round.
// ---------------------------------------------------------------------------
// Every integer type, spelled as single identifiers (functional casts need them).
typedef signed char msl_sim_schar;
typedef long long msl_sim_llong;
typedef unsigned long long msl_sim_ullong;
#define MSL_SIM_FOR_EACH_INT(M)                                                 \
  M(char)                                                                       \
  M(msl_sim_schar)                                                              \
  M(uchar)                                                                      \
  M(short)                                                                      \
  M(ushort)                                                                     \
  M(int)                                                                        \
  M(uint)                                                                       \
  M(long)                                                                       \
  M(ulong)                                                                      \
  M(msl_sim_llong)                                                              \
  M(msl_sim_ullong)

#define MSL_SIM_UNARY_F(name, builtin)                                          \
  MSL_SIM_INLINE float name(float x) { return builtin(x); }                     \
  MSL_SIM_INLINE half name(half x) { return half(builtin(float(x))); }          \
  MSL_SIM_INLINE bfloat name(bfloat x) { return bfloat(builtin(float(x))); }

namespace msl_sim_math {
MSL_SIM_INLINE float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
MSL_SIM_INLINE float fract(float x) {
  // Metal: x - floor(x), clamped below 1 (0x1.fffffep-1).
  const float f = x - __builtin_floorf(x);
  return f < 0x1.fffffep-1f ? f : 0x1.fffffep-1f;
}
MSL_SIM_INLINE float sign(float x) {
  return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : (x == x ? x : 0.0f));
}
MSL_SIM_INLINE float saturate(float x) { return __builtin_fminf(__builtin_fmaxf(x, 0.0f), 1.0f); }
} // namespace msl_sim_math

#define MSL_SIM_UNARY_LIST(M)                                                   \
  M(exp, __builtin_expf)                                                        \
  M(exp2, __builtin_exp2f)                                                      \
  M(exp10, __builtin_exp10f)                                                    \
  M(log, __builtin_logf)                                                        \
  M(log2, __builtin_log2f)                                                      \
  M(log10, __builtin_log10f)                                                    \
  M(sqrt, __builtin_sqrtf)                                                      \
  M(rsqrt, msl_sim_math::rsqrt)                                                 \
  M(floor, __builtin_floorf)                                                    \
  M(ceil, __builtin_ceilf)                                                      \
  M(trunc, __builtin_truncf)                                                    \
  M(round, __builtin_roundf)                                                    \
  M(rint, __builtin_rintf)                                                      \
  M(fabs, __builtin_fabsf)                                                      \
  M(abs, __builtin_fabsf)                                                       \
  M(sin, __builtin_sinf)                                                        \
  M(cos, __builtin_cosf)                                                        \
  M(tan, __builtin_tanf)                                                        \
  M(asin, __builtin_asinf)                                                      \
  M(acos, __builtin_acosf)                                                      \
  M(atan, __builtin_atanf)                                                      \
  M(sinh, __builtin_sinhf)                                                      \
  M(cosh, __builtin_coshf)                                                      \
  M(tanh, __builtin_tanhf)                                                      \
  M(asinh, __builtin_asinhf)                                                    \
  M(acosh, __builtin_acoshf)                                                    \
  M(atanh, __builtin_atanhf)                                                    \
  M(fract, msl_sim_math::fract)                                                 \
  M(sign, msl_sim_math::sign)                                                   \
  M(saturate, msl_sim_math::saturate)
MSL_SIM_UNARY_LIST(MSL_SIM_UNARY_F)
#undef MSL_SIM_UNARY_F

#define MSL_SIM_BINARY_F(name, builtin)                                                  \
  MSL_SIM_INLINE float name(float x, float y) { return builtin(x, y); }                  \
  MSL_SIM_INLINE half name(half x, half y) { return half(builtin(float(x), float(y))); } \
  MSL_SIM_INLINE bfloat name(bfloat x, bfloat y) {                                       \
    return bfloat(builtin(float(x), float(y)));                                          \
  }
// Metal's min/max for floating point follow fmin/fmax (a NaN operand is ignored).
#define MSL_SIM_BINARY_LIST(M)                                                  \
  M(pow, __builtin_powf)                                                        \
  M(powr, __builtin_powf)                                                       \
  M(fmod, __builtin_fmodf)                                                      \
  M(atan2, __builtin_atan2f)                                                    \
  M(copysign, __builtin_copysignf)                                              \
  M(fmin, __builtin_fminf)                                                      \
  M(fmax, __builtin_fmaxf)                                                      \
  M(fdim, __builtin_fdimf)                                                      \
  M(min, __builtin_fminf)                                                       \
  M(max, __builtin_fmaxf)
MSL_SIM_BINARY_LIST(MSL_SIM_BINARY_F)
#undef MSL_SIM_BINARY_F

// fma: float is exact (libm fmaf). half/bfloat: the product of two 16-bit
// values is exact in float; the sum is rounded to float, then to the type.
MSL_SIM_INLINE float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
MSL_SIM_INLINE half fma(half a, half b, half c) {
  return half(__builtin_fmaf(float(a), float(b), float(c)));
}
MSL_SIM_INLINE bfloat fma(bfloat a, bfloat b, bfloat c) {
  return bfloat(__builtin_fmaf(float(a), float(b), float(c)));
}

#define MSL_SIM_FLOAT_EXTRAS(T)                                                        \
  MSL_SIM_INLINE T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }             \
  MSL_SIM_INLINE T mix(T x, T y, T a) { return T(x + T(T(y - x) * a)); }               \
  MSL_SIM_INLINE T step(T edge, T x) { return x < edge ? T(0.0f) : T(1.0f); }          \
  MSL_SIM_INLINE bool isnan(T x) { return float(x) != float(x); }                      \
  MSL_SIM_INLINE bool isinf(T x) { return __builtin_isinf(float(x)) != 0; }            \
  MSL_SIM_INLINE bool isfinite(T x) { return __builtin_isfinite(float(x)) != 0; }      \
  MSL_SIM_INLINE bool signbit(T x) { return __builtin_signbit(float(x)) != 0; }
MSL_SIM_FLOAT_EXTRAS(float)
MSL_SIM_FLOAT_EXTRAS(half)
MSL_SIM_FLOAT_EXTRAS(bfloat)
#undef MSL_SIM_FLOAT_EXTRAS

// Integer functions: one non-template overload per type (like MSL), so mixed
// signed/unsigned arguments are ambiguous instead of silently converted.
#define MSL_SIM_INT_FUNCS(T)                                                              \
  MSL_SIM_INLINE constexpr T min(T a, T b) { return b < a ? b : a; }                      \
  MSL_SIM_INLINE constexpr T max(T a, T b) { return a < b ? b : a; }                      \
  MSL_SIM_INLINE constexpr T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }       \
  MSL_SIM_INLINE constexpr T abs(T x) {                                                   \
    return std::is_signed<T>::value && x < T(0) ? T(-x) : x;                              \
  }                                                                                       \
  MSL_SIM_INLINE constexpr T popcount(T x) {                                              \
    return T(__builtin_popcountll((unsigned long long)(std::make_unsigned_t<T>)x));       \
  }                                                                                       \
  MSL_SIM_INLINE constexpr T clz(T x) {                                                   \
    constexpr int W = int(sizeof(T) * 8);                                                 \
    const unsigned long long u = (unsigned long long)(std::make_unsigned_t<T>)x;          \
    return T(u == 0 ? W : __builtin_clzll(u) - (64 - W));                                 \
  }                                                                                       \
  MSL_SIM_INLINE constexpr T ctz(T x) {                                                   \
    constexpr int W = int(sizeof(T) * 8);                                                 \
    const unsigned long long u = (unsigned long long)(std::make_unsigned_t<T>)x;          \
    return T(u == 0 ? W : __builtin_ctzll(u));                                            \
  }                                                                                       \
  MSL_SIM_INLINE constexpr T reverse_bits(T x) {                                          \
    typedef std::make_unsigned_t<T> U;                                                    \
    U u = U(x), r = 0;                                                                    \
    for (int i = 0; i < int(sizeof(T) * 8); ++i) r = U((r << 1) | ((u >> i) & 1u));      \
    return T(r);                                                                          \
  }                                                                                       \
  MSL_SIM_INLINE constexpr T extract_bits(T x, uint offset, uint bits) {                  \
    typedef std::make_unsigned_t<T> U;                                                    \
    constexpr uint W = uint(sizeof(T) * 8);                                               \
    if (bits == 0) return T(0);                                                           \
    U v = U(U(x) >> offset);                                                              \
    if (bits < W) {                                                                       \
      const U mask = U((U(1) << bits) - 1u);                                              \
      v = U(v & mask);                                                                    \
      if (std::is_signed<T>::value && ((v >> (bits - 1)) & 1u)) v = U(v | U(~mask));      \
    }                                                                                     \
    return T(v);                                                                          \
  }                                                                                       \
  MSL_SIM_INLINE constexpr T insert_bits(T base, T insert, uint offset, uint bits) {      \
    typedef std::make_unsigned_t<T> U;                                                    \
    constexpr uint W = uint(sizeof(T) * 8);                                               \
    if (bits == 0) return base;                                                           \
    const U mask = bits < W ? U(((U(1) << bits) - 1u) << offset) : U(~U(0));              \
    return T(U((U(base) & U(~mask)) | (U(U(insert) << offset) & mask)));                  \
  }                                                                                       \
  MSL_SIM_INLINE constexpr T select(T a, T b, bool c) { return c ? b : a; }
MSL_SIM_FOR_EACH_INT(MSL_SIM_INT_FUNCS)
#undef MSL_SIM_INT_FUNCS

template <class T, std::enable_if_t<!std::is_integral<T>::value, int> = 0>
MSL_SIM_INLINE constexpr T select(T a, T b, bool c) { return c ? b : a; }

// Vector versions, elementwise. Declared after every scalar overload so the
// elementwise call binds to the right one for every component type.
#define MSL_SIM_VEC_UNARY(name, unused)                                         \
  template <class T, int N> MSL_SIM_INLINE vec<T, N> name(const vec<T, N> &v) { \
    vec<T, N> r{};                                                              \
    for (int i = 0; i < N; ++i) r[i] = name(v[i]);                              \
    return r;                                                                   \
  }
MSL_SIM_UNARY_LIST(MSL_SIM_VEC_UNARY)
#undef MSL_SIM_VEC_UNARY
#define MSL_SIM_VEC_BINARY(name, unused)                                         \
  template <class T, int N>                                                      \
  MSL_SIM_INLINE vec<T, N> name(const vec<T, N> &a, const vec<T, N> &b) {        \
    vec<T, N> r{};                                                               \
    for (int i = 0; i < N; ++i) r[i] = name(a[i], b[i]);                         \
    return r;                                                                    \
  }
MSL_SIM_BINARY_LIST(MSL_SIM_VEC_BINARY)
#undef MSL_SIM_VEC_BINARY
#undef MSL_SIM_UNARY_LIST
#undef MSL_SIM_BINARY_LIST

template <class T, int N>
MSL_SIM_INLINE vec<T, N> fma(const vec<T, N> &a, const vec<T, N> &b, const vec<T, N> &c) {
  vec<T, N> r{};
  for (int i = 0; i < N; ++i) r[i] = fma(a[i], b[i], c[i]);
  return r;
}
template <class T, int N>
MSL_SIM_INLINE vec<T, N> clamp(const vec<T, N> &x, const vec<T, N> &lo, const vec<T, N> &hi) {
  vec<T, N> r{};
  for (int i = 0; i < N; ++i) r[i] = clamp(x[i], lo[i], hi[i]);
  return r;
}
template <class T, int N>
MSL_SIM_INLINE constexpr vec<T, N> select(const vec<T, N> &a, const vec<T, N> &b,
                                          const vec<bool, N> &c) {
  vec<T, N> r{};
  for (int i = 0; i < N; ++i) r[i] = c[i] ? b[i] : a[i];
  return r;
}
template <class T, int N> MSL_SIM_INLINE T dot(const vec<T, N> &a, const vec<T, N> &b) {
  T s = T(a[0] * b[0]);
  for (int i = 1; i < N; ++i) s = T(s + T(a[i] * b[i]));
  return s;
}

// Metal's explicit precision variants map to the same host implementations.
namespace precise {
using metal::cos;
using metal::exp;
using metal::exp2;
using metal::log;
using metal::log2;
using metal::pow;
using metal::rsqrt;
using metal::sin;
using metal::sqrt;
using metal::tanh;
using metal::clamp;
using metal::fmax;
using metal::fmin;
using metal::max;
using metal::min;
} // namespace precise
namespace fast {
using namespace precise;
} // namespace fast

// ---------------------------------------------------------------------------
// numeric_limits (std's for builtin types, plus half and bfloat).
// ---------------------------------------------------------------------------
template <class T> struct numeric_limits : std::numeric_limits<T> {};
#define MSL_SIM_F16_LIMITS(H, MIN, MAX, LOWEST, EPS, INF, NAN_, DENORM, DIGITS)     \
  template <> struct numeric_limits<H> {                                        \
    static constexpr bool is_specialized = true;                                \
    static constexpr bool is_signed = true;                                     \
    static constexpr bool is_integer = false;                                   \
    static constexpr bool has_infinity = true;                                  \
    static constexpr bool has_quiet_NaN = true;                                 \
    static constexpr int digits = DIGITS;                                       \
    static constexpr H min() { return H::from_bits(MIN); }                      \
    static constexpr H max() { return H::from_bits(MAX); }                      \
    static constexpr H lowest() { return H::from_bits(LOWEST); }                \
    static constexpr H epsilon() { return H::from_bits(EPS); }                  \
    static constexpr H infinity() { return H::from_bits(INF); }                 \
    static constexpr H quiet_NaN() { return H::from_bits(NAN_); }               \
    static constexpr H denorm_min() { return H::from_bits(DENORM); }            \
  };
MSL_SIM_F16_LIMITS(half, 0x0400, 0x7bff, 0xfbff, 0x1400, 0x7c00, 0x7e00, 0x0001, 11)
MSL_SIM_F16_LIMITS(bfloat, 0x0080, 0x7f7f, 0xff7f, 0x3c00, 0x7f80, 0x7fc0, 0x0001, 8)
#undef MSL_SIM_F16_LIMITS

} // namespace metal

// ---------------------------------------------------------------------------
// Runtime interface (implemented after the kernel, see runtime.cpp).
// ---------------------------------------------------------------------------
namespace msl_sim_rt {

// The values of Metal's thread attributes for one simulated thread. Field
// names equal the attribute names so the generated call can name them.
struct ThreadInfo {
  metal::uint3 thread_position_in_grid;
  metal::uint3 threadgroup_position_in_grid;
  metal::uint3 thread_position_in_threadgroup;
  metal::uint3 threads_per_threadgroup; // actual size of this (maybe partial) threadgroup
  metal::uint3 dispatch_threads_per_threadgroup; // the requested threadgroup size
  metal::uint3 threadgroups_per_grid;
  metal::uint3 threads_per_grid;
  metal::uint3 grid_size;
  metal::uint3 grid_origin;
  uint thread_index_in_threadgroup;
  uint thread_index_in_simdgroup;
  uint simdgroup_index_in_threadgroup;
  uint simdgroups_per_threadgroup;
  uint dispatch_simdgroups_per_threadgroup;
  uint threads_per_simdgroup;
  uint thread_execution_width;
  uint thread_index_in_quadgroup;
  uint quadgroup_index_in_threadgroup;
  uint quadgroups_per_threadgroup;
  uint dispatch_quadgroups_per_threadgroup;
};

// Shape metadata of an input buffer (the `name_shape` / `name_strides` /
// `name_ndim` kernel parameters).
struct ArgMeta {
  const int *shape;
  const int64_t *strides;
  int ndim;
};

// What the generated kernel unit exports to the runtime.
struct KernelInfo {
  const char *name;
  int num_inputs;
  int num_outputs;
  const char *const *buffer_names; // inputs, then outputs
  void (*invoke)(const ThreadInfo &, void *const *buffers, const ArgMeta *input_meta);
};
extern const KernelInfo kernel_info;

constexpr int kSimdWidth = 32;
constexpr int kSlotBytes = 64;

// Per-SIMD-group mailbox of one collective operation: each arriving lane
// stores its operand in its slot; once every live lane has arrived the
// scheduler records the active lanes and resumes them, and each lane computes
// its own result from the slots.
struct Exchange {
  alignas(16) unsigned char slot[kSimdWidth][kSlotBytes];
  uint32_t param[kSimdWidth];
  uint32_t active; // bit l set: lane l took part (exists and has not returned)
};

// Arrive at a SIMD-group collective and wait until all live lanes of the
// SIMD-group have arrived at the same operation. `param` is a per-lane
// argument; when `uniform_param` is set it must be equal on all lanes.
const Exchange &collective(const char *op, const void *data, unsigned size, uint32_t param,
                           bool uniform_param, const char *file, int line, int col);
// Arrive at threadgroup_barrier and wait for all threads of the threadgroup.
void threadgroup_barrier(const char *file, int line, int col);
// SIMD lane of the calling thread.
unsigned lane();
[[noreturn]] void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// MSL_SIM_STRICT=1: undefined results that are otherwise tolerated (see
// read_lane) become errors.
extern bool strict;

template <class T> MSL_SIM_INLINE T read_slot(const Exchange &ex, unsigned l) {
  T v;
  std::memcpy(static_cast<void *>(&v), ex.slot[l], sizeof(T));
  return v;
}

// Value of lane `src` for a shuffle-like operation.
// * Reading a lane that exists but does not take part (it returned, or is
//   past the threadgroup's last thread) is an error.
// * A lane ID outside 0..31 is outside the MSL contract and its result is
//   undefined. Kernels do this on lanes whose result they discard, so it
//   yields a poison value (all bits set: NaN for floating point) that shows
//   up in any output it reaches; with MSL_SIM_STRICT=1 it is an error.
template <class T>
MSL_SIM_INLINE T read_lane(const Exchange &ex, unsigned src, const char *op, const char *file,
                           int line, int col) {
  if (src >= unsigned(kSimdWidth)) {
    if (strict)
      fatal("%s at %s:%d: lane %u asks for lane %u, which is not a valid SIMD lane (0..31)", op,
            file, line, lane(), src);
    T poison;
    std::memset(static_cast<void *>(&poison), 0xff, sizeof(T));
    return poison;
  }
  if (!((ex.active >> src) & 1u))
    fatal("%s at %s:%d: lane %u reads lane %u, which is inactive (it has returned from the "
          "kernel or does not exist in this threadgroup); Metal leaves the result undefined",
          op, file, line, lane(), src);
  (void)col;
  return read_slot<T>(ex, src);
}

template <class T> constexpr void check_payload() {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= kSlotBytes,
                "msl-sim: SIMD-group operations support trivially copyable values of at most 64 "
                "bytes");
}

} // namespace msl_sim_rt

namespace metal {

// ---------------------------------------------------------------------------
// Synchronization.
// ---------------------------------------------------------------------------
enum class mem_flags : int {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

// All threads of a threadgroup run on one OS thread and see each other's
// memory directly, so the memory flags need no action; the barrier itself is
// a scheduling point that every thread must reach.
MSL_SIM_INLINE void threadgroup_barrier(mem_flags, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::threadgroup_barrier(MSL_SIM_LOC);
}
MSL_SIM_INLINE void simdgroup_barrier(mem_flags, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::collective("simdgroup_barrier", nullptr, 0, 0, false, MSL_SIM_LOC);
}

// ---------------------------------------------------------------------------
// SIMD-group functions (32 lanes). Results follow the MSL specification; a
// reduction visits the active lanes in increasing lane order and combines them
// with the type's own arithmetic (so half sums round after every addition).
// ---------------------------------------------------------------------------
template <class T> MSL_SIM_INLINE T simd_shuffle(T data, ushort simd_lane_id, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::check_payload<T>();
  const auto &ex =
      msl_sim_rt::collective("simd_shuffle", &data, sizeof(T), 0, false, MSL_SIM_LOC);
  return msl_sim_rt::read_lane<T>(ex, simd_lane_id, "simd_shuffle", MSL_SIM_LOC);
}

template <class T> MSL_SIM_INLINE T simd_broadcast(T data, ushort broadcast_lane_id, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::check_payload<T>();
  const auto &ex = msl_sim_rt::collective("simd_broadcast", &data, sizeof(T), broadcast_lane_id,
                                          true, MSL_SIM_LOC);
  return msl_sim_rt::read_lane<T>(ex, broadcast_lane_id, "simd_broadcast", MSL_SIM_LOC);
}

// Lanes whose source lies past lane 31 keep their own value (no wrap-around).
template <class T> MSL_SIM_INLINE T simd_shuffle_down(T data, ushort delta, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::check_payload<T>();
  const auto &ex =
      msl_sim_rt::collective("simd_shuffle_down", &data, sizeof(T), delta, true, MSL_SIM_LOC);
  const unsigned src = msl_sim_rt::lane() + delta;
  if (src >= unsigned(msl_sim_rt::kSimdWidth)) return data;
  return msl_sim_rt::read_lane<T>(ex, src, "simd_shuffle_down", MSL_SIM_LOC);
}

// Lanes whose source lies below lane 0 keep their own value (no wrap-around).
template <class T> MSL_SIM_INLINE T simd_shuffle_up(T data, ushort delta, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::check_payload<T>();
  const auto &ex =
      msl_sim_rt::collective("simd_shuffle_up", &data, sizeof(T), delta, true, MSL_SIM_LOC);
  const unsigned me = msl_sim_rt::lane();
  if (delta > me) return data;
  return msl_sim_rt::read_lane<T>(ex, me - delta, "simd_shuffle_up", MSL_SIM_LOC);
}

template <class T> MSL_SIM_INLINE T simd_shuffle_rotate_down(T data, ushort delta, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::check_payload<T>();
  const auto &ex = msl_sim_rt::collective("simd_shuffle_rotate_down", &data, sizeof(T), delta,
                                          true, MSL_SIM_LOC);
  const unsigned src = (msl_sim_rt::lane() + delta) % unsigned(msl_sim_rt::kSimdWidth);
  return msl_sim_rt::read_lane<T>(ex, src, "simd_shuffle_rotate_down", MSL_SIM_LOC);
}

template <class T> MSL_SIM_INLINE T simd_shuffle_rotate_up(T data, ushort delta, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::check_payload<T>();
  const auto &ex = msl_sim_rt::collective("simd_shuffle_rotate_up", &data, sizeof(T), delta,
                                          true, MSL_SIM_LOC);
  const unsigned w = unsigned(msl_sim_rt::kSimdWidth);
  const unsigned src = (msl_sim_rt::lane() + w - (delta % w)) % w;
  return msl_sim_rt::read_lane<T>(ex, src, "simd_shuffle_rotate_up", MSL_SIM_LOC);
}

template <class T> MSL_SIM_INLINE T simd_shuffle_xor(T data, ushort mask, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::check_payload<T>();
  const auto &ex =
      msl_sim_rt::collective("simd_shuffle_xor", &data, sizeof(T), mask, true, MSL_SIM_LOC);
  return msl_sim_rt::read_lane<T>(ex, msl_sim_rt::lane() ^ mask, "simd_shuffle_xor", MSL_SIM_LOC);
}

template <class T> MSL_SIM_INLINE T simd_broadcast_first(T data, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::check_payload<T>();
  const auto &ex =
      msl_sim_rt::collective("simd_broadcast_first", &data, sizeof(T), 0, false, MSL_SIM_LOC);
  return msl_sim_rt::read_slot<T>(ex, unsigned(__builtin_ctz(ex.active)));
}

namespace msl_sim_reduce {
// Folds the active lanes whose index is in [0, end) in increasing lane order.
template <class T, class F>
MSL_SIM_INLINE T fold(const msl_sim_rt::Exchange &ex, unsigned end, T init, F f) {
  T acc = init;
  for (unsigned l = 0; l < end; ++l)
    if ((ex.active >> l) & 1u) acc = f(acc, msl_sim_rt::read_slot<T>(ex, l));
  return acc;
}
template <class T, class F>
MSL_SIM_INLINE T fold_all(const msl_sim_rt::Exchange &ex, F f) {
  const unsigned first = unsigned(__builtin_ctz(ex.active));
  T acc = msl_sim_rt::read_slot<T>(ex, first);
  for (unsigned l = first + 1; l < unsigned(msl_sim_rt::kSimdWidth); ++l)
    if ((ex.active >> l) & 1u) acc = f(acc, msl_sim_rt::read_slot<T>(ex, l));
  return acc;
}
} // namespace msl_sim_reduce

#define MSL_SIM_SIMD_REDUCE(NAME, EXPR)                                                      \
  template <class T> MSL_SIM_INLINE T NAME(T data, MSL_SIM_LOC_PARAMS) {                     \
    msl_sim_rt::check_payload<T>();                                                          \
    const auto &ex = msl_sim_rt::collective(#NAME, &data, sizeof(T), 0, false, MSL_SIM_LOC); \
    return msl_sim_reduce::fold_all<T>(ex, [](T a, T b) { return T(EXPR); });                \
  }
MSL_SIM_SIMD_REDUCE(simd_sum, a + b)
MSL_SIM_SIMD_REDUCE(simd_product, a * b)
MSL_SIM_SIMD_REDUCE(simd_max, max(a, b))
MSL_SIM_SIMD_REDUCE(simd_min, min(a, b))
MSL_SIM_SIMD_REDUCE(simd_and, a & b)
MSL_SIM_SIMD_REDUCE(simd_or, a | b)
MSL_SIM_SIMD_REDUCE(simd_xor, a ^ b)
#undef MSL_SIM_SIMD_REDUCE

template <class T> MSL_SIM_INLINE T simd_prefix_exclusive_sum(T data, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::check_payload<T>();
  const auto &ex = msl_sim_rt::collective("simd_prefix_exclusive_sum", &data, sizeof(T), 0, false,
                                          MSL_SIM_LOC);
  return msl_sim_reduce::fold<T>(ex, msl_sim_rt::lane(), T(0),
                                 [](T a, T b) { return T(a + b); });
}
template <class T> MSL_SIM_INLINE T simd_prefix_inclusive_sum(T data, MSL_SIM_LOC_PARAMS) {
  msl_sim_rt::check_payload<T>();
  const auto &ex = msl_sim_rt::collective("simd_prefix_inclusive_sum", &data, sizeof(T), 0, false,
                                          MSL_SIM_LOC);
  return msl_sim_reduce::fold<T>(ex, msl_sim_rt::lane() + 1, T(0),
                                 [](T a, T b) { return T(a + b); });
}

MSL_SIM_INLINE bool simd_all(bool expr, MSL_SIM_LOC_PARAMS) {
  const auto &ex = msl_sim_rt::collective("simd_all", &expr, sizeof(bool), 0, false, MSL_SIM_LOC);
  return msl_sim_reduce::fold<bool>(ex, msl_sim_rt::kSimdWidth, true,
                                    [](bool a, bool b) { return a && b; });
}
MSL_SIM_INLINE bool simd_any(bool expr, MSL_SIM_LOC_PARAMS) {
  const auto &ex = msl_sim_rt::collective("simd_any", &expr, sizeof(bool), 0, false, MSL_SIM_LOC);
  return msl_sim_reduce::fold<bool>(ex, msl_sim_rt::kSimdWidth, false,
                                    [](bool a, bool b) { return a || b; });
}

typedef ulong vote_t;
class simd_vote {
public:
  explicit constexpr simd_vote(vote_t v = 0) : v_(v) {}
  explicit constexpr operator vote_t() const { return v_; }
  constexpr bool all() const { return v_ == 0xffffffffu; }
  constexpr bool any() const { return v_ != 0; }

private:
  vote_t v_;
};
MSL_SIM_INLINE simd_vote simd_ballot(bool expr, MSL_SIM_LOC_PARAMS) {
  const auto &ex = msl_sim_rt::collective("simd_ballot", &expr, sizeof(bool), 0, false, MSL_SIM_LOC);
  vote_t v = 0;
  for (unsigned l = 0; l < unsigned(msl_sim_rt::kSimdWidth); ++l)
    if (((ex.active >> l) & 1u) && msl_sim_rt::read_slot<bool>(ex, l)) v |= vote_t(1) << l;
  return simd_vote(v);
}
MSL_SIM_INLINE bool simd_is_first(MSL_SIM_LOC_PARAMS) {
  const auto &ex = msl_sim_rt::collective("simd_is_first", nullptr, 0, 0, false, MSL_SIM_LOC);
  return unsigned(__builtin_ctz(ex.active)) == msl_sim_rt::lane();
}

// ---------------------------------------------------------------------------
// simdgroup_matrix (8x8 only). Lane l holds elements (fm, fn) and (fm, fn+1)
// with qid = l / 4, fm = (qid & 4) + (l / 2) % 4, fn = (qid & 2) * 2 + (l % 2) * 2
// (Apple's fragment layout; the same for every operand).
// ---------------------------------------------------------------------------
namespace msl_sim_matrix {
constexpr unsigned frag_row(unsigned l) { return ((l / 4) & 4u) + (l / 2) % 4; }
constexpr unsigned frag_col(unsigned l) { return ((l / 4) & 2u) * 2 + (l % 2) * 2; }
// Lane holding element (r, c) of a fragment, and which of its two elements.
constexpr unsigned owner_lane(unsigned r, unsigned c) {
  // Inverse of the layout: r = 4*b4 + 2*b2 + b1, c = 4*b3 + 2*b0 (+1), l = b4..b0.
  return ((r >> 2) & 1u) << 4 | ((c >> 2) & 1u) << 3 | ((r >> 1) & 1u) << 2 | (r & 1u) << 1 |
         ((c >> 1) & 1u);
}
static_assert(frag_row(owner_lane(5, 3)) == 5 && frag_col(owner_lane(5, 3)) == 2, "layout");
static_assert(frag_row(owner_lane(6, 7)) == 6 && frag_col(owner_lane(6, 7)) == 6, "layout");
// A collective that needs all 32 lanes of the SIMD-group.
MSL_SIM_INLINE const msl_sim_rt::Exchange &full_collective(const char *op, const void *data,
                                                           unsigned size, const char *file,
                                                           int line, int col) {
  const auto &ex = msl_sim_rt::collective(op, data, size, 0, false, file, line, col);
  if (ex.active != 0xffffffffu)
    msl_sim_rt::fatal("%s at %s:%d needs all 32 lanes of the SIMD-group, but the active lane "
                      "mask is 0x%08x",
                      op, file, line, ex.active);
  return ex;
}
// Memory offset of element j (0 or 1) of lane l's fragment for simdgroup_load/store:
// element (r, c) is at (origin.y + r) * elements_per_row + origin.x + c, with r and c
// swapped when transposing.
MSL_SIM_INLINE ulong memory_offset(unsigned l, ulong j, ulong elements_per_row, ulong2 origin,
                                   bool transpose) {
  const ulong r = frag_row(l), c = frag_col(l) + j;
  return (origin.y + (transpose ? c : r)) * elements_per_row + origin.x + (transpose ? r : c);
}
} // namespace msl_sim_matrix

template <class T, int Cols, int Rows> struct simdgroup_matrix {
  static_assert(Cols == 8 && Rows == 8, "msl-sim supports only 8x8 simdgroup_matrix");
  vec<T, 2> elems_;
  simdgroup_matrix() = default;
  // A diagonal matrix with `diag` on the diagonal (as in MSL).
  simdgroup_matrix(T diag) {
    const unsigned l = msl_sim_rt::lane();
    const unsigned r = msl_sim_matrix::frag_row(l), c = msl_sim_matrix::frag_col(l);
    elems_.x = r == c ? diag : T(0);
    elems_.y = r == c + 1 ? diag : T(0);
  }
  vec<T, 2> &thread_elements() { return elems_; }
  const vec<T, 2> &thread_elements() const { return elems_; }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

template <class T, int Cols, int Rows>
MSL_SIM_INLINE simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(const T value) {
  simdgroup_matrix<T, Cols, Rows> m;
  m.elems_ = vec<T, 2>(value, value);
  return m;
}

// D = A * B + C, a collective over all 32 lanes. Each output element is
// accumulated in float: acc = C(m, n); for k = 0..7: acc = fma(A(m, k), B(k, n), acc);
// then converted to D's element type. Operands may have different types.
template <class TD, class TA, class TB, class TC>
MSL_SIM_INLINE void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8> &d,
                                                  const simdgroup_matrix<TA, 8, 8> &a,
                                                  const simdgroup_matrix<TB, 8, 8> &b,
                                                  const simdgroup_matrix<TC, 8, 8> &c,
                                                  MSL_SIM_LOC_PARAMS) {
  const float mine[6] = {float(a.elems_.x), float(a.elems_.y), float(b.elems_.x),
                         float(b.elems_.y), float(c.elems_.x), float(c.elems_.y)};
  const auto &ex = msl_sim_matrix::full_collective("simdgroup_multiply_accumulate", mine,
                                                   sizeof(mine), MSL_SIM_LOC);
  auto elem = [&](int operand, unsigned r, unsigned col) {
    const unsigned o = msl_sim_matrix::owner_lane(r, col);
    float v[6];
    std::memcpy(v, ex.slot[o], sizeof(v));
    return v[2 * operand + (col & 1u)];
  };
  const unsigned l = msl_sim_rt::lane();
  const unsigned m = msl_sim_matrix::frag_row(l), n0 = msl_sim_matrix::frag_col(l);
  float out[2];
  for (unsigned j = 0; j < 2; ++j) {
    float acc = elem(2, m, n0 + j);
    for (unsigned k = 0; k < 8; ++k) acc = __builtin_fmaf(elem(0, m, k), elem(1, k, n0 + j), acc);
    out[j] = acc;
  }
  d.elems_.x = TD(out[0]);
  d.elems_.y = TD(out[1]);
}

template <class TD, class TA, class TB>
MSL_SIM_INLINE void simdgroup_multiply(simdgroup_matrix<TD, 8, 8> &d,
                                       const simdgroup_matrix<TA, 8, 8> &a,
                                       const simdgroup_matrix<TB, 8, 8> &b, MSL_SIM_LOC_PARAMS) {
  simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<float, 8, 8>(0.0f),
                                MSL_SIM_LOC);
}

// Loads/stores element (r, c) at src[(origin.y + r) * elements_per_row + origin.x + c]
// (with r and c swapped when transposing). Collective: all lanes must take part.
template <class T, class U>
MSL_SIM_INLINE void simdgroup_load(simdgroup_matrix<T, 8, 8> &d, const U *src,
                                   ulong elements_per_row = 8, ulong2 matrix_origin = ulong2(0),
                                   bool transpose_matrix = false, MSL_SIM_LOC_PARAMS) {
  msl_sim_matrix::full_collective("simdgroup_load", nullptr, 0, MSL_SIM_LOC);
  const unsigned l = msl_sim_rt::lane();
  for (ulong j = 0; j < 2; ++j)
    d.elems_[int(j)] = T(src[msl_sim_matrix::memory_offset(l, j, elements_per_row, matrix_origin,
                                                           transpose_matrix)]);
}

template <class T, class U>
MSL_SIM_INLINE void simdgroup_store(const simdgroup_matrix<T, 8, 8> &a, U *dst,
                                    ulong elements_per_row = 8, ulong2 matrix_origin = ulong2(0),
                                    bool transpose_matrix = false, MSL_SIM_LOC_PARAMS) {
  msl_sim_matrix::full_collective("simdgroup_store", nullptr, 0, MSL_SIM_LOC);
  const unsigned l = msl_sim_rt::lane();
  for (ulong j = 0; j < 2; ++j)
    dst[msl_sim_matrix::memory_offset(l, j, elements_per_row, matrix_origin, transpose_matrix)] =
        U(a.elems_[int(j)]);
}

// ---------------------------------------------------------------------------
// Atomics. atomic<T> has the size and layout of T, so an output buffer can be
// viewed as an array of atomics. Operations are real (relaxed) atomics since
// threadgroups run in parallel on several OS threads.
// ---------------------------------------------------------------------------
enum memory_order {
  memory_order_relaxed,
  memory_order_acquire,
  memory_order_release,
  memory_order_acq_rel,
  memory_order_seq_cst,
};

template <class T> struct atomic {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "msl-sim: atomic<T> needs a 32- or 64-bit T");
  T value_;
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<float> atomic_float;
typedef atomic<ulong> atomic_ulong;

namespace msl_sim_atomic {
template <class T> struct id { typedef T type; };
template <class T> using bits_t = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
// Read-modify-write through a compare-exchange loop on the bit pattern (works
// for float as well as integers).
template <class T, class F> MSL_SIM_INLINE T rmw(volatile atomic<T> *obj, F f) {
  auto *p = reinterpret_cast<bits_t<T> *>(const_cast<atomic<T> *>(obj));
  bits_t<T> old = __atomic_load_n(p, __ATOMIC_RELAXED);
  for (;;) {
    const T cur = __builtin_bit_cast(T, old);
    const bits_t<T> next = __builtin_bit_cast(bits_t<T>, T(f(cur)));
    if (__atomic_compare_exchange_n(p, &old, next, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED))
      return cur;
  }
}
} // namespace msl_sim_atomic

template <class T>
MSL_SIM_INLINE T atomic_load_explicit(const volatile atomic<T> *obj, memory_order) {
  auto *p = reinterpret_cast<const msl_sim_atomic::bits_t<T> *>(const_cast<const atomic<T> *>(obj));
  return __builtin_bit_cast(T, __atomic_load_n(p, __ATOMIC_SEQ_CST));
}
template <class T>
MSL_SIM_INLINE void atomic_store_explicit(volatile atomic<T> *obj,
                                          typename msl_sim_atomic::id<T>::type v, memory_order) {
  auto *p = reinterpret_cast<msl_sim_atomic::bits_t<T> *>(const_cast<atomic<T> *>(obj));
  __atomic_store_n(p, __builtin_bit_cast(msl_sim_atomic::bits_t<T>, v), __ATOMIC_SEQ_CST);
}
template <class T>
MSL_SIM_INLINE T atomic_exchange_explicit(volatile atomic<T> *obj,
                                          typename msl_sim_atomic::id<T>::type v, memory_order) {
  return msl_sim_atomic::rmw(obj, [v](T) { return v; });
}
#define MSL_SIM_ATOMIC_RMW(NAME, EXPR)                                                  \
  template <class T>                                                                    \
  MSL_SIM_INLINE T NAME(volatile atomic<T> *obj, typename msl_sim_atomic::id<T>::type v, \
                        memory_order) {                                                 \
    return msl_sim_atomic::rmw(obj, [v](T a) { return EXPR; });                         \
  }
MSL_SIM_ATOMIC_RMW(atomic_fetch_add_explicit, a + v)
MSL_SIM_ATOMIC_RMW(atomic_fetch_sub_explicit, a - v)
MSL_SIM_ATOMIC_RMW(atomic_fetch_and_explicit, a & v)
MSL_SIM_ATOMIC_RMW(atomic_fetch_or_explicit, a | v)
MSL_SIM_ATOMIC_RMW(atomic_fetch_xor_explicit, a ^ v)
MSL_SIM_ATOMIC_RMW(atomic_fetch_min_explicit, v < a ? v : a)
MSL_SIM_ATOMIC_RMW(atomic_fetch_max_explicit, a < v ? v : a)
#undef MSL_SIM_ATOMIC_RMW
template <class T>
MSL_SIM_INLINE bool atomic_compare_exchange_weak_explicit(volatile atomic<T> *obj, T *expected,
                                                          typename msl_sim_atomic::id<T>::type desired,
                                                          memory_order, memory_order) {
  auto *p = reinterpret_cast<msl_sim_atomic::bits_t<T> *>(const_cast<atomic<T> *>(obj));
  auto exp_bits = __builtin_bit_cast(msl_sim_atomic::bits_t<T>, *expected);
  const bool ok =
      __atomic_compare_exchange_n(p, &exp_bits, __builtin_bit_cast(msl_sim_atomic::bits_t<T>, desired),
                                  false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  if (!ok) *expected = __builtin_bit_cast(T, exp_bits);
  return ok;
}

// ---------------------------------------------------------------------------
// Deliberately unsupported features: using one fails to compile with a
// message that names it.
// ---------------------------------------------------------------------------
#define MSL_SIM_UNSUPPORTED_FN(NAME)                                                    \
  template <class... A> int NAME(A &&...) {                                             \
    static_assert(msl_sim_detail::dependent_false<A...>::value,                         \
                  "msl-sim does not support " #NAME);                                   \
    return 0;                                                                           \
  }
MSL_SIM_UNSUPPORTED_FN(simd_prefix_inclusive_product)
MSL_SIM_UNSUPPORTED_FN(simd_prefix_exclusive_product)
MSL_SIM_UNSUPPORTED_FN(simd_shuffle_and_fill_up)
MSL_SIM_UNSUPPORTED_FN(simd_shuffle_and_fill_down)
MSL_SIM_UNSUPPORTED_FN(simd_active_threads_mask)
MSL_SIM_UNSUPPORTED_FN(quad_shuffle)
MSL_SIM_UNSUPPORTED_FN(quad_shuffle_up)
MSL_SIM_UNSUPPORTED_FN(quad_shuffle_down)
MSL_SIM_UNSUPPORTED_FN(quad_shuffle_xor)
MSL_SIM_UNSUPPORTED_FN(quad_broadcast)
MSL_SIM_UNSUPPORTED_FN(quad_sum)
MSL_SIM_UNSUPPORTED_FN(quad_max)
MSL_SIM_UNSUPPORTED_FN(quad_min)
MSL_SIM_UNSUPPORTED_FN(quad_ballot)
MSL_SIM_UNSUPPORTED_FN(simdgroup_async_copy)
#undef MSL_SIM_UNSUPPORTED_FN

struct access {
  enum { sample, read, write, read_write };
};
#define MSL_SIM_UNSUPPORTED_TYPE(NAME, WHAT)                                            \
  template <class T = float, int A = 0> struct NAME {                                   \
    static_assert(msl_sim_detail::dependent_false<T>::value,                            \
                  "msl-sim does not support " WHAT " (" #NAME ")");                     \
  };
MSL_SIM_UNSUPPORTED_TYPE(texture1d, "textures")
MSL_SIM_UNSUPPORTED_TYPE(texture2d, "textures")
MSL_SIM_UNSUPPORTED_TYPE(texture3d, "textures")
MSL_SIM_UNSUPPORTED_TYPE(texture2d_array, "textures")
MSL_SIM_UNSUPPORTED_TYPE(texturecube, "textures")
MSL_SIM_UNSUPPORTED_TYPE(depth2d, "textures")
#undef MSL_SIM_UNSUPPORTED_TYPE
struct sampler {
  template <class... A> sampler(A &&...) {
    static_assert(msl_sim_detail::dependent_false<A...>::value,
                  "msl-sim does not support samplers (sampler)");
  }
};

// Helper from MLX's kernel utilities that custom kernels commonly call: the
// memory offset of the elem-th element (row-major order) of a strided array.
template <class IdxT = int64_t>
MSL_SIM_INLINE IdxT elem_to_loc(IdxT elem, const int *shape, const int64_t *strides, int ndim) {
  IdxT loc = 0;
  for (int i = ndim - 1; i >= 0 && elem > 0; --i) {
    loc += IdxT(elem % shape[i]) * IdxT(strides[i]);
    elem /= shape[i];
  }
  return loc;
}
MSL_SIM_INLINE int64_t elem_to_loc(uint elem, const int *shape, const int64_t *strides, int ndim) {
  return elem_to_loc<int64_t>(int64_t(elem), shape, strides, ndim);
}

} // namespace metal

// Constants from <metal_math> (macros in MSL too).
#define MAXFLOAT 0x1.fffffep+127f
#define FLT_MAX 0x1.fffffep+127f
#define FLT_MIN 0x1p-126f
#define FLT_EPSILON 0x1p-23f
#define HALF_MAX (metal::half::from_bits(0x7bff))
#define HALF_MIN (metal::half::from_bits(0x0400))
#define HALF_EPSILON (metal::half::from_bits(0x1400))
#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define M_PI_F 3.14159265358979323846264338327950288f
#define M_E_F 2.71828182845904523536028747135266250f
#define M_LN2_F 0.693147180559945309417232121458176568f
#define M_LOG2E_F 1.44269504088896340735992468100189214f
#define M_SQRT2_F 1.41421356237309504880168872420969808f
#define METAL_FUNC inline __attribute__((always_inline))
