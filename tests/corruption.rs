//! The corruption sweep (issue 31): seeded mutations of small valid artifacts (config, index and
//! safetensors files: truncations, bit flips, header field edits, offsets, shapes, dtypes,
//! duplicate keys, index entries that leave the directory, non-finite scales), each loaded in
//! process. Every case must end either in `Ok` with modules whose tensors are exactly what the
//! file holds (checked against the `safetensors` crate's own reading) and whose forward pass is
//! finite and matches the f64 reference, or in the library's typed error of the artifact kind
//! (`Error::Artifact` naming a file of the model directory, or `Error::Io`). A panic fails the
//! sweep (`catch_unwind`); an abort kills the test binary; a case that hangs trips the watchdog.
//!
//! `MLX_TRELLIS_SWEEP_CASES` overrides the number of cases (default 100,000 over two threads).
//!
//! A second, smaller sweep covers input that is valid but extreme, and files that are not what
//! they seem: stored rows of magnitudes from 0 and 1e-12 to 1e4 through the encoder (exact zeros
//! for rows below f16's scale range, never an error larger than the row), activations of
//! magnitudes 1e-8 to 1e8 through the CPU paths (against the f64 reference), directories
//! holding another model's index or shards when an artifact is written, and FIFOs,
//! directories and devices in place of an artifact's files (refused, never waited on).

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mlx_trellis::trellis::encoder::{encode, quality, EncoderConfig};
use mlx_trellis::trellis::reference::{expand, forward_f64, rel_err};
use mlx_trellis::trellis::synthetic::SplitMix64;
use mlx_trellis::trellis::{synthetic_layer, write_artifact, Artifact, CodeLayout, ForwardPath, TrellisLinear};
use mlx_trellis::{f16, save_safetensors, Error, ErrorKind, MlxArray};
use serde_json::{json, Value};

mod common;
use common::{join_safetensors, split_safetensors};

const DOWN: &str = "model.layers.0.mlp.down_proj";
const UP: &str = "model.layers.0.mlp.up_proj";
const MODULES: [&str; 2] = [DOWN, UP];
const HIDDEN: usize = 512;
const INTER: usize = 16;
const DEFAULT_CASES: u64 = 100_000;
/// Loaded cases whose forward pass is run and checked: every one of the first few thousand, then
/// every eighth (the loading itself, which is what is being swept, runs in every case).
const FORWARD_ALL_BELOW: u64 = 4096;
const FORWARD_EVERY: u64 = 8;
/// A case that takes longer than this is taken for a hang.
const HANG: Duration = Duration::from_secs(60);

/// The pristine files of one artifact layout.
#[derive(Clone)]
struct Pristine {
    files: BTreeMap<String, Vec<u8>>,
}

/// How a case ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Outcome {
    Loaded,
    LoadedAndRun,
    Refused(ErrorKind),
}

fn layers(seed: u64) -> (TrellisLinear, TrellisLinear) {
    let down = synthetic_layer(INTER, HIDDEN, 3, 12, 0, CodeLayout::K3Interleaved, 0.05, seed).unwrap();
    let up = synthetic_layer(INTER, HIDDEN, 2, 12, 1, CodeLayout::RowMajor, 0.05, seed + 1).unwrap();
    (TrellisLinear::from_host(DOWN, &down).unwrap(), TrellisLinear::from_host(UP, &up).unwrap())
}

fn read_dir_files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect()
}

/// A single-file artifact and a sharded one (codes in one shard, scales in the other).
fn pristine(base: &Path) -> (Pristine, Pristine) {
    let (down, up) = layers(1);
    let extra = [("hidden_size", json!(HIDDEN)), ("intermediate_size", json!(INTER))];
    let single = base.join("pristine-single");
    write_artifact(&single, &[(DOWN, &down), (UP, &up)], &extra).unwrap();
    let sharded = base.join("pristine-sharded");
    std::fs::create_dir_all(&sharded).unwrap();
    std::fs::copy(single.join("config.json"), sharded.join("config.json")).unwrap();
    let meta = BTreeMap::new();
    let (dw, uw, ds, us) =
        (format!("{DOWN}.weight"), format!("{UP}.weight"), format!("{DOWN}.scales"), format!("{UP}.scales"));
    let shard1 = [(dw.as_str(), down.codes()), (uw.as_str(), up.codes())];
    save_safetensors(sharded.join("model-00001-of-00002.safetensors"), shard1, &meta).unwrap();
    let shard2 = [(ds.as_str(), down.scales()), (us.as_str(), up.scales())];
    save_safetensors(sharded.join("model-00002-of-00002.safetensors"), shard2, &meta).unwrap();
    let index = json!({"metadata": {"total_size": 0}, "weight_map": {
        &dw: "model-00001-of-00002.safetensors", &uw: "model-00001-of-00002.safetensors",
        &ds: "model-00002-of-00002.safetensors", &us: "model-00002-of-00002.safetensors"}});
    std::fs::write(sharded.join("model.safetensors.index.json"), serde_json::to_vec_pretty(&index).unwrap()).unwrap();
    // Both must load as they are.
    for dir in [&single, &sharded] {
        let art = Artifact::open(dir).unwrap();
        for m in MODULES {
            art.module(m).unwrap();
        }
    }
    (Pristine { files: read_dir_files(&single) }, Pristine { files: read_dir_files(&sharded) })
}

fn pick<'a, T>(rng: &mut SplitMix64, items: &'a [T]) -> &'a T {
    &items[(rng.next_u64() % items.len() as u64) as usize]
}

fn below(rng: &mut SplitMix64, n: usize) -> usize {
    (rng.next_u64() % n.max(1) as u64) as usize
}

/// Values that stress a JSON field: wrong types, out-of-range and boundary numbers.
fn odd_value(rng: &mut SplitMix64) -> Value {
    let choices = [
        json!(null),
        json!(true),
        json!("3"),
        json!(-1),
        json!(0),
        json!(1),
        json!(2),
        json!(3),
        json!(4),
        json!(9),
        json!(12),
        json!(17),
        json!(255),
        json!(256),
        json!(512),
        json!(1.5),
        json!(3.0),
        json!(2147483647u64),
        json!(2147483648u64),
        json!(2147483664u64),
        json!(4294967295u64),
        json!(4294967296u64),
        json!(4294967552u64),
        json!(u64::MAX),
        json!(-9223372036854775808i64),
        json!(1e300),
        json!([]),
        json!([1, 2]),
        json!({}),
    ];
    pick(rng, &choices).clone()
}

/// Shapes that break a tensor entry.
fn odd_shape(rng: &mut SplitMix64, shape: &[Value]) -> Value {
    let mut s: Vec<Value> = shape.to_vec();
    match below(rng, 9) {
        0 => json!([]),
        1 if !s.is_empty() => {
            let i = below(rng, s.len());
            s[i] = odd_value(rng);
            Value::Array(s)
        }
        2 => {
            s.reverse();
            Value::Array(s)
        }
        3 => {
            s.push(json!(1 + below(rng, 3)));
            Value::Array(s)
        }
        4 if !s.is_empty() => {
            s.pop();
            Value::Array(s)
        }
        5 if !s.is_empty() => {
            let i = below(rng, s.len());
            let d = s[i].as_u64().unwrap_or(1);
            s[i] = json!(d.wrapping_mul(2 + below(rng, 3) as u64));
            Value::Array(s)
        }
        6 => json!([4294967552u64]),
        7 => json!([2147483647, 2147483647, 2147483647]),
        _ => odd_value(rng),
    }
}

fn odd_dtype(rng: &mut SplitMix64) -> Value {
    let names = [
        "BOOL", "U8", "I8", "U16", "I16", "F16", "BF16", "U32", "I32", "F32", "U64", "I64", "F64", "C64", "F8_E4M3",
        "F8_E5M2", "F4", "f16", "u32", "", "X",
    ];
    if below(rng, 8) == 0 {
        odd_value(rng)
    } else {
        json!(pick(rng, &names))
    }
}

fn odd_offsets(rng: &mut SplitMix64, offsets: &[Value], data_len: usize) -> Value {
    let (s, e) = (offsets[0].as_u64().unwrap_or(0), offsets[1].as_u64().unwrap_or(0));
    let d = 1 + below(rng, 16) as u64;
    match below(rng, 11) {
        0 => json!([e, s]),
        1 => json!([s + d, e + d]),
        2 => json!([s.saturating_sub(d), e.saturating_sub(d)]),
        3 => json!([s, e + d]),
        4 => json!([s, e.saturating_sub(d)]),
        5 => json!([0, e - s]),
        6 => json!([data_len, data_len as u64 + (e - s)]),
        7 => json!([s, e, e]),
        8 => json!([s as f64 + 0.5, e]),
        9 => json!([s, u64::MAX]),
        _ => json!([odd_value(rng), odd_value(rng)]),
    }
}

/// Serialises a header object, optionally repeating one key (serde_json's maps cannot hold a
/// duplicate, so it is spliced into the text).
fn header_with_duplicate(header: &serde_json::Map<String, Value>, rng: &mut SplitMix64) -> String {
    let text = serde_json::to_string(header).unwrap();
    let keys: Vec<&String> = header.keys().collect();
    let key = pick(rng, &keys);
    let value = if below(rng, 2) == 0 {
        header[*key].clone()
    } else {
        let other = pick(rng, &keys);
        header[*other].clone()
    };
    let dup = format!("{}:{},", serde_json::to_string(key).unwrap(), value);
    format!("{{{dup}{}", &text[1..])
}

/// One mutation of the safetensors file `bytes`: what it did, and the new bytes.
fn mutate_safetensors(bytes: &[u8], rng: &mut SplitMix64) -> (String, Vec<u8>) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut out = bytes.to_vec();
    match below(rng, 12) {
        0 => {
            let len = below(rng, bytes.len());
            out.truncate(len);
            (format!("truncated to {len} bytes"), out)
        }
        1 => {
            let flips = 1 + below(rng, 4);
            for _ in 0..flips {
                // Mostly in the prefix and header, where a flip changes what the file says.
                let at = if below(rng, 4) == 0 { below(rng, out.len()) } else { below(rng, 8 + n) };
                out[at] ^= 1 << below(rng, 8);
            }
            (format!("{flips} bit flips"), out)
        }
        2 => {
            let at = 8 + below(rng, n);
            out[at] = rng.next_u32() as u8;
            (format!("header byte {at} overwritten"), out)
        }
        3 => {
            let delta = below(rng, 17) as i64 - 8;
            let len = match below(rng, 4) {
                0 => rng.next_u64(),
                1 => bytes.len() as u64,
                2 => 0,
                _ => (n as i64 + delta) as u64,
            };
            out[..8].copy_from_slice(&len.to_le_bytes());
            (format!("header length set to {len}"), out)
        }
        4 => {
            let extra = 1 + below(rng, 8);
            out.extend((0..extra).map(|_| rng.next_u32() as u8));
            (format!("{extra} bytes appended"), out)
        }
        5 => {
            // Scales' data set to special f16 values (NaN, infinities, the largest finite, zero,
            // a subnormal): each non-finite one must be refused, the others must load and run.
            let (header, mut data) = split_safetensors(bytes);
            let scales: Vec<&String> = header.keys().filter(|k| k.ends_with(".scales")).collect();
            if scales.is_empty() {
                return ("no scales here: untouched".into(), out);
            }
            let name = pick(rng, &scales);
            let off = header[*name]["data_offsets"][0].as_u64().unwrap() as usize;
            let len = header[*name]["shape"][0].as_u64().unwrap() as usize;
            let special = [0x7E00u16, 0x7C00, 0xFC00, 0x7BFF, 0xFBFF, 0x0000, 0x0001, 0x8000];
            let (row, value) = (below(rng, len), *pick(rng, &special));
            data[off + 2 * row..off + 2 * row + 2].copy_from_slice(&value.to_le_bytes());
            let text = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
            (format!("{name} row {row} set to f16 bits {value:#06x}"), join_safetensors(text, &data))
        }
        6 => {
            let (_, mut data) = split_safetensors(bytes);
            let count = 1 + below(rng, 8);
            for _ in 0..count {
                let at = below(rng, data.len());
                data[at] = rng.next_u32() as u8;
            }
            let text = std::str::from_utf8(&bytes[8..8 + n]).unwrap();
            (format!("{count} data bytes overwritten"), join_safetensors(text, &data))
        }
        7 => {
            let (header, data) = split_safetensors(bytes);
            ("a duplicate key".to_string(), join_safetensors(&header_with_duplicate(&header, rng), &data))
        }
        _ => {
            // A structured edit of one tensor entry.
            let (mut header, data) = split_safetensors(bytes);
            let names: Vec<String> = header.keys().filter(|k| *k != "__metadata__").cloned().collect();
            let name = pick(rng, &names).clone();
            let what;
            {
                let entry = header.get_mut(&name).unwrap().as_object_mut().unwrap();
                match below(rng, 8) {
                    0 | 1 => {
                        let shape = entry["shape"].as_array().unwrap().clone();
                        let v = odd_shape(rng, &shape);
                        what = format!("{name}.shape = {v}");
                        entry.insert("shape".into(), v);
                    }
                    2 | 3 => {
                        let v = odd_dtype(rng);
                        what = format!("{name}.dtype = {v}");
                        entry.insert("dtype".into(), v);
                    }
                    4 | 5 => {
                        let offsets = entry["data_offsets"].as_array().unwrap().clone();
                        let v = odd_offsets(rng, &offsets, data.len());
                        what = format!("{name}.data_offsets = {v}");
                        entry.insert("data_offsets".into(), v);
                    }
                    6 => {
                        let field = pick(rng, &["shape", "dtype", "data_offsets"]).to_string();
                        entry.remove(&field);
                        what = format!("{name}.{field} removed");
                    }
                    _ => {
                        entry.insert("extra".into(), odd_value(rng));
                        what = format!("{name} gets an extra field");
                    }
                }
            }
            if below(rng, 6) == 0 {
                // Rename the entry (to another module's tensor name, or to nothing known).
                let entry = header.remove(&name).unwrap();
                let new =
                    pick(rng, &[format!("{DOWN}.scales"), format!("{UP}.weight"), String::new(), "x".into()]).clone();
                header.insert(new.clone(), entry);
                let text = serde_json::to_string(&header).unwrap();
                return (format!("{what}; renamed to {new:?}"), join_safetensors(&text, &data));
            }
            let meta = below(rng, 10);
            if meta == 0 {
                header.insert("__metadata__".into(), odd_value(rng));
            }
            let text = serde_json::to_string(&header).unwrap();
            (what, join_safetensors(&text, &data))
        }
    }
}

/// A JSON path inside `v` (object keys and array indices), picked at random.
fn random_path(v: &Value, rng: &mut SplitMix64) -> Vec<String> {
    let mut path = Vec::new();
    let mut cur = v;
    loop {
        let next = match cur {
            Value::Object(m) if !m.is_empty() && below(rng, 4) != 0 => {
                let keys: Vec<&String> = m.keys().collect();
                let k = (*pick(rng, &keys)).clone();
                path.push(k.clone());
                &m[&k]
            }
            Value::Array(a) if !a.is_empty() && below(rng, 4) != 0 => {
                let i = below(rng, a.len());
                path.push(i.to_string());
                &a[i]
            }
            _ => return path,
        };
        cur = next;
    }
}

fn at_path<'a>(v: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match v {
        Value::Object(m) => m.get_mut(k).unwrap(),
        Value::Array(a) => &mut a[k.parse::<usize>().unwrap()],
        _ => unreachable!(),
    })
}

/// One mutation of a JSON file (config or index).
fn mutate_json(bytes: &[u8], rng: &mut SplitMix64, shard_names: &[&str]) -> (String, Vec<u8>) {
    let mut v: Value = serde_json::from_slice(bytes).unwrap();
    match below(rng, 10) {
        0 => {
            let len = below(rng, bytes.len());
            (format!("truncated to {len} bytes"), bytes[..len].to_vec())
        }
        1 => {
            let mut out = bytes.to_vec();
            let at = below(rng, out.len());
            out[at] ^= 1 << below(rng, 8);
            (format!("bit flip at {at}"), out)
        }
        2 => {
            // A repeated key, spliced in at a random object's opening brace.
            let text = String::from_utf8(bytes.to_vec()).unwrap();
            let opens: Vec<usize> = text.match_indices('{').map(|(i, _)| i).collect();
            let at = *pick(rng, &opens);
            let obj: Value =
                serde_json::Deserializer::from_str(&text[at..]).into_iter::<Value>().next().unwrap().unwrap();
            let Some(key) = obj.as_object().and_then(|o| o.keys().next().cloned()) else {
                return ("no key to repeat: untouched".into(), bytes.to_vec());
            };
            let dup = format!("{}: {},", serde_json::to_string(&key).unwrap(), odd_value(rng));
            (format!("key {key:?} repeated"), format!("{}{dup}{}", &text[..=at], &text[at + 1..]).into_bytes())
        }
        3 => {
            let path = random_path(&v, rng);
            if path.is_empty() {
                return ("document replaced by a value".into(), odd_value(rng).to_string().into_bytes());
            }
            let (last, parent) = path.split_last().unwrap();
            match at_path(&mut v, parent) {
                Value::Object(m) => {
                    m.remove(last);
                }
                Value::Array(a) => {
                    a.remove(last.parse::<usize>().unwrap());
                }
                _ => unreachable!(),
            }
            (format!("{} removed", path.join("/")), serde_json::to_vec(&v).unwrap())
        }
        4 if !shard_names.is_empty() => {
            // Index entries that name files elsewhere.
            let Some(map) = v.get_mut("weight_map").and_then(Value::as_object_mut) else {
                return ("no weight_map: untouched".into(), bytes.to_vec());
            };
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = pick(rng, &keys).clone();
            let targets = [
                "../outside/model.safetensors",
                "/etc/passwd",
                "escape.safetensors",
                "missing.safetensors",
                ".",
                "./model-00001-of-00002.safetensors",
                "sub/../model-00001-of-00002.safetensors",
                "",
                "config.json",
            ];
            let target =
                if below(rng, 3) == 0 { pick(rng, shard_names).to_string() } else { pick(rng, &targets).to_string() };
            map.insert(key.clone(), json!(target));
            (format!("weight_map[{key:?}] = {target:?}"), serde_json::to_vec(&v).unwrap())
        }
        9 => {
            // Nesting far past serde_json's recursion limit.
            let depth = 200 + below(rng, 5000);
            let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            (format!("nested {depth} deep"), text.into_bytes())
        }
        _ => {
            let path = random_path(&v, rng);
            let value = if below(rng, 5) == 0 {
                json!(pick(rng, &["trellis", "affine", "1mad", "3inst"]))
            } else {
                odd_value(rng)
            };
            let what = format!("{} = {value}", path.join("/"));
            *at_path(&mut v, &path) = value;
            (what, serde_json::to_vec(&v).unwrap())
        }
    }
}

/// The tensors of every safetensors file in `dir`, as the `safetensors` crate reads them (files
/// it refuses are left out).
fn crate_view(files: &BTreeMap<String, Vec<u8>>) -> BTreeMap<String, Vec<Vec<u8>>> {
    let mut out: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for (name, bytes) in files {
        if !name.ends_with(".safetensors") {
            continue;
        }
        if let Ok(st) = safetensors::SafeTensors::deserialize(bytes) {
            for (t, view) in st.tensors() {
                out.entry(t).or_default().push(view.data().to_vec());
            }
        }
    }
    out
}

fn le_bytes_u32(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn le_bytes_f16(v: &[f16]) -> Vec<u8> {
    v.iter().flat_map(|w| w.to_bits().to_le_bytes()).collect()
}

/// Loads every module of `dir` and checks what loads. `Err` is the library's refusal.
fn run_case(dir: &Path, files: &BTreeMap<String, Vec<u8>>, forward: bool) -> Result<Outcome, String> {
    let loaded = (|| -> mlx_trellis::Result<Vec<TrellisLinear>> {
        let art = Artifact::open(dir)?;
        MODULES.iter().map(|m| art.module(m)).collect()
    })();
    let layers = match loaded {
        Ok(layers) => layers,
        Err(e) => return check_refusal(dir, &e).map(|()| Outcome::Refused(e.kind())),
    };
    let view = crate_view(files);
    for layer in &layers {
        let host = layer.to_host().map_err(|e| format!("{}: to_host failed: {e:#}", layer.name()))?;
        let w = le_bytes_u32(&host.codes);
        let s = le_bytes_f16(&host.scales);
        let module = layer.name().trim_end_matches(".weight");
        let holds = |name: String, bytes: &[u8]| view.get(&name).is_some_and(|v| v.iter().any(|b| b == bytes));
        if !holds(format!("{module}.weight"), &w) || !holds(format!("{module}.scales"), &s) {
            return Err(format!(
                "{module}: loaded tensors differ from what the file holds (or the safetensors crate refuses the file)"
            ));
        }
        if host.scales.iter().any(|s| !s.is_finite()) {
            return Err(format!("{module}: a non-finite scale loaded"));
        }
        if !forward {
            continue;
        }
        let g = *layer.geometry();
        let x: Vec<f32> = (0..2 * g.in_features()).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        let xa = MlxArray::from_slice(&x, &[2, g.in_features()]).map_err(|e| e.to_string())?;
        let y =
            layer.forward_with(&xa, ForwardPath::Generic).map_err(|e| format!("{module}: forward failed: {e:#}"))?;
        if !y.all_finite().map_err(|e| e.to_string())? {
            return Err(format!("{module}: non-finite output from a loaded layer"));
        }
        let got: Vec<f64> = y.to_vec::<f32>().map_err(|e| e.to_string())?.into_iter().map(f64::from).collect();
        let xr: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        let want =
            forward_f64(&xr, 2, &host.codes, &host.scales, &g).map_err(|e| format!("{module}: reference: {e:#}"))?;
        let err = rel_err(&got, &want).map_err(|e| e.to_string())?;
        if err >= 1e-5 {
            return Err(format!("{module}: relErr {err:e} against the f64 reference"));
        }
    }
    Ok(if forward { Outcome::LoadedAndRun } else { Outcome::Loaded })
}

/// A refusal must be of the artifact kind and name a file of the model directory.
fn check_refusal(dir: &Path, e: &Error) -> Result<(), String> {
    match e.root() {
        Error::Artifact { file, .. } if file.starts_with(dir) => Ok(()),
        Error::Io { path, .. } if path.starts_with(dir) => Ok(()),
        _ => Err(format!("refused with the wrong kind of error or file: {e:#} ({:?})", e.root())),
    }
}

struct Tally {
    outcomes: HashMap<Outcome, u64>,
    failures: Vec<String>,
}

fn worker(
    id: u64,
    cases: std::ops::Range<u64>,
    base: PathBuf,
    layouts: Arc<(Pristine, Pristine)>,
    progress: Arc<AtomicU64>,
    current: Arc<Mutex<Vec<String>>>,
) -> Tally {
    let dir = base.join(format!("case-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    // A link out of the directory, for index entries to name. Its target holds other layers
    // under the same names, so a read from outside could not pass the check of the data.
    let outside = base.join("outside");
    #[cfg(unix)]
    std::os::unix::fs::symlink(outside.join("model.safetensors"), dir.join("escape.safetensors")).unwrap();
    let mut on_disk: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let mut tally = Tally { outcomes: HashMap::new(), failures: Vec::new() };
    let mut loaded = 0u64;
    for case in cases {
        let mut rng = SplitMix64::new(0xC022_0971 ^ case.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let layout = if below(&mut rng, 3) == 0 { &layouts.1 } else { &layouts.0 };
        let mut files = layout.files.clone();
        let names: Vec<String> = files.keys().cloned().collect();
        let shard_names: Vec<&str> = names.iter().map(String::as_str).filter(|n| n.ends_with(".safetensors")).collect();
        let target = pick(&mut rng, &names).clone();
        let (what, bytes) = if target.ends_with(".safetensors") {
            mutate_safetensors(&files[&target], &mut rng)
        } else {
            let shards = if target.ends_with("index.json") { shard_names.clone() } else { Vec::new() };
            mutate_json(&files[&target], &mut rng, &shards)
        };
        files.insert(target.clone(), bytes);
        let label = format!("case {case}: {target}: {what}");
        current.lock().unwrap()[id as usize] = label.clone();
        // Bring the directory to this case's files, writing only what differs.
        for stale in on_disk.keys().filter(|k| !files.contains_key(*k)).cloned().collect::<Vec<_>>() {
            std::fs::remove_file(dir.join(&stale)).unwrap();
            on_disk.remove(&stale);
        }
        for (name, bytes) in &files {
            if on_disk.get(name) != Some(bytes) {
                std::fs::write(dir.join(name), bytes).unwrap();
                on_disk.insert(name.clone(), bytes.clone());
            }
        }
        let forward = loaded < FORWARD_ALL_BELOW || loaded.is_multiple_of(FORWARD_EVERY);
        match catch_unwind(AssertUnwindSafe(|| run_case(&dir, &files, forward))) {
            Ok(Ok(outcome)) => {
                if matches!(outcome, Outcome::Loaded | Outcome::LoadedAndRun) {
                    loaded += 1;
                }
                *tally.outcomes.entry(outcome).or_default() += 1;
            }
            Ok(Err(why)) => tally.failures.push(format!("{label}: {why}")),
            Err(_) => tally.failures.push(format!("{label}: PANIC")),
        }
        progress.fetch_add(1, Ordering::Relaxed);
    }
    tally
}

#[test]
fn every_corrupted_artifact_loads_checked_or_is_refused_with_a_typed_error() {
    let cases: u64 =
        std::env::var("MLX_TRELLIS_SWEEP_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(DEFAULT_CASES);
    let base = common::mlp_artifact::temp_dir("corruption");
    let layouts = Arc::new(pristine(&base));
    let (other_down, other_up) = layers(99);
    write_artifact(base.join("outside"), &[(DOWN, &other_down), (UP, &other_up)], &[]).unwrap();
    let threads = 2u64;
    let progress = Arc::new(AtomicU64::new(0));
    let current = Arc::new(Mutex::new(vec![String::new(); threads as usize]));

    // The watchdog: a case that stops the sweep's progress for longer than HANG fails it. It ends
    // with the sweep (the other test of this binary may still run).
    let finished = watchdog("corruption sweep", progress.clone(), current.clone());

    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|id| {
            let range = (cases * id / threads)..(cases * (id + 1) / threads);
            let (base, layouts, progress, current) = (base.clone(), layouts.clone(), progress.clone(), current.clone());
            std::thread::spawn(move || worker(id, range, base, layouts, progress, current))
        })
        .collect();
    let mut outcomes: HashMap<Outcome, u64> = HashMap::new();
    let mut failures = Vec::new();
    for h in handles {
        let t = h.join().expect("a sweep worker died outside its cases");
        for (o, n) in t.outcomes {
            *outcomes.entry(o).or_default() += n;
        }
        failures.extend(t.failures);
    }
    finished.store(true, Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    let done: u64 = outcomes.values().sum::<u64>() + failures.len() as u64;
    // Straight to stderr, past the test harness's capture, so that every run shows it.
    let mut summary = format!("corruption sweep: {done} cases in {secs:.1} s ({threads} threads)\n");
    let mut lines: Vec<String> = outcomes.iter().map(|(o, n)| format!("  {o:?}: {n}")).collect();
    lines.sort();
    summary += &lines.join("\n");
    let _ = writeln!(std::io::stderr(), "{summary}");
    let _ = std::fs::remove_dir_all(&base);
    assert_eq!(done, cases, "every case is classified");
    for f in failures.iter().take(20) {
        eprintln!("FAILED {f}");
    }
    assert!(failures.is_empty(), "{} of {done} cases failed (first: {:?})", failures.len(), failures.first());
    // The sweep must exercise both ends: loads that run and refusals of the artifact kind (`Io`
    // refusals are accepted too, but too rare to require of a short sweep).
    assert!(outcomes.get(&Outcome::LoadedAndRun).copied().unwrap_or(0) > 0, "no case loaded and ran");
    assert!(outcomes.get(&Outcome::Refused(ErrorKind::Artifact)).copied().unwrap_or(0) > 0, "no case was refused");
}

/// Cases of the second sweep ([`extreme_values_and_misleading_files_are_served_or_refused`]).
const EDGE_CASES: u64 = 1500;

/// One encoder case: rows of random magnitudes (some zero, some below f16's scale range) coded
/// and decoded, and the coded layer run on activations of a random magnitude by the CPU paths.
fn magnitude_case(rng: &mut SplitMix64) -> Result<String, String> {
    let (k, l) = (2 + below(rng, 3) as u32, [8u32, 10, 12][below(rng, 3)]);
    let (rows, cols) = (1 + below(rng, 6), 256 * (1 + below(rng, 2)));
    let axis = below(rng, 2) as u32;
    let magnitudes: Vec<f64> =
        (0..rows).map(|_| if below(rng, 5) == 0 { 0.0 } else { 10f64.powf(-12.0 + 16.0 * rng.next_f64()) }).collect();
    let w: Vec<f32> = (0..rows * cols).map(|i| (rng.next_gaussian() * magnitudes[i / cols]) as f32).collect();
    let cfg = EncoderConfig { axis, ..EncoderConfig::new(k, l) };
    let shown: Vec<String> = magnitudes.iter().map(|m| format!("{m:.1e}")).collect();
    let label = format!("k {k} L {l} axis {axis} [{rows}, {cols}] row magnitudes {shown:?}");
    let enc = encode(&w, rows, cols, &cfg).map_err(|e| format!("{label}: encode: {e:#}"))?;
    let decoded = expand(&enc.layer.codes, &enc.layer.scales, &enc.layer.geometry).map_err(|e| e.to_string())?;
    if decoded.iter().zip(&enc.reconstruction).any(|(a, b)| a.to_bits() != b.to_bits()) {
        return Err(format!("{label}: the decode differs from the encoder's reconstruction"));
    }
    for (r, (row, rec)) in w.chunks_exact(cols).zip(decoded.chunks_exact(cols)).enumerate() {
        let power: f64 = row.iter().map(|&v| f64::from(v).powi(2)).sum();
        let err: f64 = row.iter().zip(rec).map(|(&a, &b)| (f64::from(a) - f64::from(b)).powi(2)).sum();
        let scale = enc.layer.scales[r].to_f32();
        if scale == 0.0 && rec.iter().any(|&v| v != 0.0) {
            return Err(format!("{label}: row {r} of scale 0 does not decode to zeros"));
        }
        if err > power {
            return Err(format!("{label}: row {r}'s error {err:e} exceeds its energy {power:e}"));
        }
        if scale != 0.0 && err >= 0.5 * power {
            return Err(format!("{label}: row {r} (scale {scale:e}) has relative error {}", err / power));
        }
    }
    quality(&w, &enc).map_err(|e| e.to_string())?;
    // The CPU paths on activations of one random magnitude.
    let layer = TrellisLinear::from_host("edge", &enc.layer).map_err(|e| format!("{label}: {e:#}"))?;
    let g = enc.layer.geometry;
    let m = 1 + below(rng, 3);
    let x_scale = 10f64.powf(-8.0 + 16.0 * rng.next_f64());
    let x: Vec<f32> = (0..m * g.in_features()).map(|_| (rng.next_gaussian() * x_scale) as f32).collect();
    let xa = MlxArray::from_slice(&x, &[m, g.in_features()]).map_err(|e| e.to_string())?;
    let xr: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let want = forward_f64(&xr, m, &enc.layer.codes, &enc.layer.scales, &g).map_err(|e| e.to_string())?;
    for path in [ForwardPath::Generic, ForwardPath::Host, ForwardPath::Reference] {
        let y = layer.forward_with(&xa, path).map_err(|e| format!("{label}: {path}: {e:#}"))?;
        let got: Vec<f64> = y.to_vec::<f32>().map_err(|e| e.to_string())?.into_iter().map(f64::from).collect();
        let err = rel_err(&got, &want).map_err(|e| e.to_string())?;
        // All-zero outputs (every row of scale 0) compare exactly.
        if !(err < 1e-5 || (want.iter().all(|&v| v == 0.0) && got.iter().all(|&v| v == 0.0))) {
            return Err(format!("{label}: {path} path at activations ~{x_scale:.1e}: relErr {err:e}"));
        }
    }
    Ok("magnitudes".into())
}

/// What a directory may hold from another model when an artifact is written into it.
fn stale_case(rng: &mut SplitMix64, dir: &Path) -> Result<String, String> {
    let _ = std::fs::remove_dir_all(dir);
    let (old_down, old_up) = layers(1000 + below(rng, 1000) as u64);
    write_artifact(dir, &[(DOWN, &old_down), (UP, &old_up)], &[]).map_err(|e| e.to_string())?;
    let index = dir.join("model.safetensors.index.json");
    let kind = below(rng, 5);
    let map = |file: &str| json!({ "weight_map": { format!("{DOWN}.weight"): file, format!("{DOWN}.scales"): file } });
    match kind {
        0 => {}
        1 => std::fs::write(&index, r#"{"weight_map": {}}"#).unwrap(),
        2 => std::fs::write(&index, map("gone.safetensors").to_string()).unwrap(),
        3 => {
            std::fs::copy(dir.join("model.safetensors"), dir.join("old-00001-of-00001.safetensors")).unwrap();
            std::fs::write(&index, map("old-00001-of-00001.safetensors").to_string()).unwrap();
        }
        _ => {
            std::fs::copy(dir.join("model.safetensors"), dir.join("old-00001-of-00001.safetensors")).unwrap();
        }
    }
    let (new_down, new_up) = layers(2000 + below(rng, 1000) as u64);
    match write_artifact(dir, &[(DOWN, &new_down), (UP, &new_up)], &[]) {
        Err(e) if e.kind() == ErrorKind::Artifact && e.to_string().contains("model.safetensors.index.json") => {
            if !index.exists() {
                return Err(format!("stale kind {kind}: refused without an index: {e:#}"));
            }
            // The old files stay readable as they were, or refused; never mixed with new ones.
            return Ok(format!("stale {kind} refused"));
        }
        Err(e) => return Err(format!("stale kind {kind}: write failed: {e:#}")),
        Ok(()) => {}
    }
    if index.exists() {
        return Err(format!("stale kind {kind}: written beside an index"));
    }
    let art = Artifact::open(dir).map_err(|e| format!("stale kind {kind}: {e:#}"))?;
    for (name, want) in [(DOWN, &new_down), (UP, &new_up)] {
        let got = art.module(name).map_err(|e| format!("stale kind {kind}: {e:#}"))?;
        if got.to_host().unwrap().codes != want.to_host().unwrap().codes {
            return Err(format!("stale kind {kind}: {name} loaded from an older file"));
        }
    }
    Ok(format!("stale {kind} written"))
}

/// One of an artifact's files replaced by a FIFO, a directory or a link to a device.
fn special_file_case(rng: &mut SplitMix64, dir: &Path) -> Result<String, String> {
    let _ = std::fs::remove_dir_all(dir);
    let (down, up) = layers(7);
    write_artifact(dir, &[(DOWN, &down), (UP, &up)], &[]).map_err(|e| e.to_string())?;
    let sharded = below(rng, 2) == 0;
    if sharded {
        std::fs::rename(dir.join("model.safetensors"), dir.join("part.safetensors")).unwrap();
        let map = json!({ "weight_map": {
            format!("{DOWN}.weight"): "part.safetensors", format!("{DOWN}.scales"): "part.safetensors",
            format!("{UP}.weight"): "part.safetensors", format!("{UP}.scales"): "part.safetensors",
        }});
        std::fs::write(dir.join("model.safetensors.index.json"), map.to_string()).unwrap();
    }
    let targets: &[&str] = if sharded {
        &["config.json", "model.safetensors.index.json", "part.safetensors"]
    } else {
        &["config.json", "model.safetensors"]
    };
    let target = dir.join(pick(rng, targets));
    std::fs::remove_file(&target).unwrap();
    let what = match below(rng, 3) {
        0 => {
            let ok = std::process::Command::new("mkfifo").arg(&target).status().is_ok_and(|s| s.success());
            assert!(ok, "mkfifo {}", target.display());
            "a FIFO"
        }
        1 => {
            std::fs::create_dir(&target).unwrap();
            "a directory"
        }
        _ => {
            #[cfg(unix)]
            std::os::unix::fs::symlink("/dev/zero", &target).unwrap();
            "a link to /dev/zero"
        }
    };
    let loaded = (|| -> mlx_trellis::Result<()> {
        let art = Artifact::open(dir)?;
        art.module(DOWN)?;
        art.module(UP)?;
        Ok(())
    })();
    match loaded {
        Ok(()) => Err(format!("{} as {what} loaded", target.display())),
        Err(e) => check_refusal(dir, &e).map(|()| format!("{what} refused")),
    }
}

/// The watchdog of a sweep: when `progress` stops moving for longer than [`HANG`], it prints
/// what `current` says is running and ends the process (a hang fails the test). It stops once
/// the returned flag is set.
fn watchdog<T: std::fmt::Debug + Send + 'static>(
    who: &'static str,
    progress: Arc<AtomicU64>,
    current: Arc<Mutex<T>>,
) -> Arc<std::sync::atomic::AtomicBool> {
    let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = finished.clone();
    std::thread::spawn(move || {
        let (mut last, mut since) = (0, Instant::now());
        while !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(500));
            let now = progress.load(Ordering::Relaxed);
            if now != last {
                (last, since) = (now, Instant::now());
            } else if since.elapsed() > HANG {
                eprintln!("{who}: no progress for {HANG:?}; running: {:?}", current.lock().unwrap());
                std::process::exit(101);
            }
        }
    });
    finished
}

#[test]
fn extreme_values_and_misleading_files_are_served_or_refused() {
    let base = common::mlp_artifact::temp_dir("edge-sweep");
    let (progress, current) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(String::new())));
    let finished = watchdog("edge sweep", progress.clone(), current.clone());
    let start = Instant::now();
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    let mut failures = Vec::new();
    for case in 0..EDGE_CASES {
        let mut rng = SplitMix64::new(0xED6E_0037 ^ case.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let dir = base.join("case");
        let kind = below(&mut rng, 3);
        *current.lock().unwrap() = format!("case {case} (kind {kind})");
        let result = catch_unwind(AssertUnwindSafe(|| match kind {
            0 => magnitude_case(&mut rng),
            1 => stale_case(&mut rng, &dir),
            _ => special_file_case(&mut rng, &dir),
        }));
        match result {
            Ok(Ok(outcome)) => *outcomes.entry(outcome).or_default() += 1,
            Ok(Err(why)) => failures.push(format!("case {case}: {why}")),
            Err(_) => failures.push(format!("case {case}: PANIC")),
        }
        progress.fetch_add(1, Ordering::Relaxed);
    }
    finished.store(true, Ordering::Relaxed);
    let _ = writeln!(
        std::io::stderr(),
        "edge sweep: {EDGE_CASES} cases in {:.1} s: {outcomes:?}",
        start.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&base);
    for f in failures.iter().take(20) {
        eprintln!("FAILED {f}");
    }
    assert!(failures.is_empty(), "{} of {EDGE_CASES} cases failed (first: {:?})", failures.len(), failures.first());
    for needed in ["magnitudes", "stale 0 written", "stale 1 refused", "a FIFO refused"] {
        assert!(outcomes.contains_key(needed), "no case gave {needed:?}: {outcomes:?}");
    }
}
