// Force-included into every mlx-c translation unit.
//
// mlx-c 0.7.0 formats a few error messages with `std::format`, which libstdc++ only ships from
// gcc 13 on. On older standard libraries this supplies a minimal stand-in that handles the plain
// `{}` placeholders those messages use; where the real `std::format` exists this header is inert.
#pragma once
#include <version>
#if !defined(__cpp_lib_format)
#include <sstream>
#include <string>
#include <string_view>

namespace mlx_sys_fmt {
inline void append(std::ostringstream& out, std::string_view& fmt) {
  out << fmt;
  fmt = {};
}
template <typename Arg, typename... Rest>
void append(std::ostringstream& out, std::string_view& fmt, const Arg& arg, const Rest&... rest) {
  const auto at = fmt.find("{}");
  if (at == std::string_view::npos) {
    out << fmt;
    fmt = {};
    return;
  }
  out << fmt.substr(0, at) << arg;
  fmt.remove_prefix(at + 2);
  append(out, fmt, rest...);
}
}  // namespace mlx_sys_fmt

namespace std {
template <typename... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream out;
  mlx_sys_fmt::append(out, fmt, args...);
  return out.str();
}
}  // namespace std
#endif
