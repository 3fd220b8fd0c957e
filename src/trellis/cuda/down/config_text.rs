//! The text form of a [`CudaDownConfig`], as the benchmarks take it on their command lines and
//! print it in their tables: `nc2 mt1 ks4 w8 s13 st4 prescaled mbar`.
//!
//! Each number field is its prefix and value (`nc` sub-tiles a warp, `mt` 8-row tiles a pass,
//! `ks` 16-row chunks a step, `w` warps a block, `s` splits, `st` ring stages); each option set is
//! its word (`fold`, `pack`, `prescaled`, `mbar`, `direct`; `unroll` for
//! [`StepUnroll::BothRings`], `unroll2` for [`StepUnroll::BTileSlots`]). Parsing takes the fields
//! in any order and the ones not given from [`CudaDownConfig::default`]; printing writes every
//! number field and the options set, so a printed configuration parses back to itself. Whether a
//! configuration fits a geometry is [`CudaDownConfig::check`]'s to say, not the parser's.

use std::fmt;
use std::str::FromStr;

use super::config::{CudaDownConfig, StepUnroll};
use crate::error::{invalid, Error, Result};

impl fmt::Display for CudaDownConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "nc{} mt{} ks{} w{} s{} st{}", self.nc, self.mt, self.ks, self.warps, self.splits, self.stages)?;
        let options = [
            (self.bias_fold, "fold"),
            (self.pack_fma, "pack"),
            (self.prescaled, "prescaled"),
            (self.mbarriers, "mbar"),
            (self.step_unroll == StepUnroll::BothRings, "unroll"),
            (self.step_unroll == StepUnroll::BTileSlots, "unroll2"),
            (self.direct_codes, "direct"),
        ];
        for (_, word) in options.iter().filter(|(set, _)| *set) {
            write!(f, " {word}")?;
        }
        Ok(())
    }
}

impl FromStr for CudaDownConfig {
    type Err = Error;

    /// One configuration: its fields separated by white space (module docs).
    fn from_str(text: &str) -> Result<CudaDownConfig> {
        let mut c = CudaDownConfig::default();
        let mut any = false;
        for token in text.split_whitespace() {
            any = true;
            match token {
                "fold" => c.bias_fold = true,
                "pack" => c.pack_fma = true,
                "prescaled" => c.prescaled = true,
                "mbar" => c.mbarriers = true,
                "unroll" => c.step_unroll = StepUnroll::BothRings,
                "unroll2" => c.step_unroll = StepUnroll::BTileSlots,
                "direct" => c.direct_codes = true,
                _ => {
                    // "st" before "s": the longer prefix first.
                    let fields: [(&str, &mut u32); 6] = [
                        ("nc", &mut c.nc),
                        ("mt", &mut c.mt),
                        ("ks", &mut c.ks),
                        ("st", &mut c.stages),
                        ("w", &mut c.warps),
                        ("s", &mut c.splits),
                    ];
                    let Some((prefix, field)) = fields.into_iter().find(|(p, _)| token.starts_with(p)) else {
                        invalid!("down kernel configuration {text:?}: unknown field {token:?}");
                    };
                    *field = match token[prefix.len()..].parse() {
                        Ok(v) => v,
                        Err(_) => invalid!("down kernel configuration {text:?}: {token:?} is not {prefix} and a count"),
                    };
                }
            }
        }
        if !any {
            invalid!("down kernel configuration {text:?}: no field");
        }
        Ok(c)
    }
}

/// Configurations separated by `;` (empty ones between separators skipped), at least one.
#[cfg_attr(not(feature = "tuning"), allow(dead_code))] // the benchmarks' (`tuning`)
pub fn parse_list(text: &str) -> Result<Vec<CudaDownConfig>> {
    let configs =
        text.split(';').map(str::trim).filter(|s| !s.is_empty()).map(str::parse).collect::<Result<Vec<_>>>()?;
    if configs.is_empty() {
        invalid!("no down kernel configuration in {text:?}");
    }
    Ok(configs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::Dtype;
    use crate::trellis::cuda::down::plan::plan_for;
    use crate::trellis::format::TrellisGeometry;

    #[test]
    fn every_planned_configuration_prints_and_parses_back_to_itself() {
        let qwen = TrellisGeometry::row_major(17408, 5120, 3, 256, 12, 0).unwrap();
        let small = TrellisGeometry::row_major(200, 1024, 2, 256, 12, 0).unwrap();
        let mut seen = std::collections::HashSet::new();
        for g in [qwen, qwen.interleaved().unwrap(), small] {
            for dtype in [Dtype::Float32, Dtype::Float16, Dtype::Bfloat16] {
                for m in 1..=200 {
                    let cfg = plan_for(&g, m, dtype);
                    let text = cfg.to_string();
                    assert_eq!(text.parse::<CudaDownConfig>().unwrap(), cfg, "{text}");
                    seen.insert(text);
                }
            }
        }
        // The plans use options of every kind, so the round trip covers them.
        let all = seen.iter().cloned().collect::<Vec<_>>().join(" ");
        for word in ["fold", "pack", "prescaled", "mbar", "unroll2", "direct"] {
            assert!(all.split(' ').any(|w| w == word), "no planned configuration sets {word}: {all}");
        }
    }

    #[test]
    fn fields_come_in_any_order_and_the_rest_from_the_default() {
        let c: CudaDownConfig = "mbar prescaled s13 w8 ks4 nc2".parse().unwrap();
        let want = CudaDownConfig {
            nc: 2,
            ks: 4,
            warps: 8,
            splits: 13,
            prescaled: true,
            mbarriers: true,
            ..CudaDownConfig::default()
        };
        assert_eq!(c, want);
        assert_eq!(c.to_string(), "nc2 mt1 ks4 w8 s13 st4 prescaled mbar");
        let unrolled: CudaDownConfig = "st6 unroll".parse().unwrap();
        assert_eq!((unrolled.stages, unrolled.splits, unrolled.step_unroll), (6, 32, StepUnroll::BothRings));
        assert_eq!(unrolled.to_string(), "nc4 mt1 ks2 w4 s32 st6 unroll");
    }

    #[test]
    fn bad_text_is_refused_naming_the_field() {
        for (text, says) in [
            ("nc2 bogus", "unknown field \"bogus\""),
            ("nc", "\"nc\" is not nc and a count"),
            ("s-1", "\"s-1\" is not s and a count"),
            ("w99999999999", "is not w and a count"),
            ("   ", "no field"),
        ] {
            let e = text.parse::<CudaDownConfig>().unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
        assert_eq!(parse_list(" nc2 ;; nc8 pack ; ").unwrap().len(), 2);
        assert!(parse_list(" ; ").unwrap_err().to_string().contains("no down kernel configuration"));
        assert!(parse_list("nc2; x").unwrap_err().to_string().contains("unknown field \"x\""));
    }
}
