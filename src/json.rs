//! Strict JSON for the files the library reads (safetensors headers, `config.json`, the shard
//! index): `serde_json` for the grammar and numbers, plus the two things it leaves open. It
//! resolves a duplicate object key silently (the last one wins), so every document is first
//! walked once by a visitor that refuses duplicates at any depth; and it has no size limit, so
//! files are read through a cap.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::io::Read;
use std::path::Path;

use serde::de::{DeserializeOwned, DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};

use crate::error::{Error, Result};

/// A JSON document that is not acceptable: the key path concerned (object keys from the root,
/// joined by `/`), where there is one, and what is wrong.
#[derive(Debug)]
pub(crate) struct JsonProblem {
    pub(crate) key: Option<String>,
    pub(crate) message: String,
}

impl JsonProblem {
    /// As an [`Error::Artifact`] about `file`.
    pub(crate) fn into_error(self, file: &Path) -> Error {
        Error::artifact(file, self.key.as_deref(), self.message)
    }
}

/// Parses `text` as one JSON document into `T`, refusing duplicate keys anywhere in it.
pub(crate) fn parse<T: DeserializeOwned>(text: &[u8]) -> std::result::Result<T, JsonProblem> {
    check_no_duplicate_keys(text)?;
    serde_json::from_slice(text).map_err(|e| JsonProblem { key: None, message: format!("is not valid JSON: {e}") })
}

/// Refuses a document with a duplicate key in any object; grammar errors are serde_json's.
fn check_no_duplicate_keys(text: &[u8]) -> std::result::Result<(), JsonProblem> {
    let path = RefCell::new(Vec::new());
    let duplicate = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(text);
    let walked = NoDuplicates { path: &path, duplicate: &duplicate }.deserialize(&mut de).and_then(|()| de.end());
    match (walked, duplicate.into_inner()) {
        (Ok(()), _) => Ok(()),
        (Err(e), Some(key)) => Err(JsonProblem { key: Some(key), message: format!("duplicate key ({e})") }),
        (Err(e), None) => Err(JsonProblem { key: None, message: format!("is not valid JSON: {e}") }),
    }
}

/// Reads `path` whole, refusing (before reading further) a file over `cap` bytes.
pub(crate) fn read_capped(path: &Path, cap: u64, what: &str) -> Result<Vec<u8>> {
    let file = crate::files::open_regular_file(path)?;
    let mut bytes = Vec::new();
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
    if bytes.len() as u64 > cap {
        return Err(Error::artifact(path, None, format!("is larger than {cap} bytes, the limit for {what}")));
    }
    Ok(bytes)
}

/// Walks any JSON value, remembering each object's keys; a repeated one is an error, recorded
/// with its key path in `duplicate`.
struct NoDuplicates<'a> {
    path: &'a RefCell<Vec<String>>,
    duplicate: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for NoDuplicates<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for NoDuplicates<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while seq.next_element_seed(NoDuplicates { path: self.path, duplicate: self.duplicate })?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                let mut path = self.path.borrow().clone();
                path.push(key.clone());
                *self.duplicate.borrow_mut() = Some(path.join("/"));
                return Err(A::Error::custom(format!("key {key:?} appears twice in one object")));
            }
            self.path.borrow_mut().push(key.clone());
            map.next_value_seed(NoDuplicates { path: self.path, duplicate: self.duplicate })?;
            self.path.borrow_mut().pop();
            seen.insert(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(text: &str) -> JsonProblem {
        parse::<serde_json::Value>(text.as_bytes()).expect_err(text)
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth_with_their_path() {
        let p = problem(r#"{"a": 1, "b": {"c": [{"d": 1, "d": 2}]}}"#);
        assert_eq!(p.key.as_deref(), Some("b/c/d"));
        assert!(p.message.contains("\"d\" appears twice"), "{}", p.message);
        assert_eq!(problem(r#"{"x": 1, "x": 1}"#).key.as_deref(), Some("x"));
        // The same key in sibling objects is fine.
        parse::<serde_json::Value>(br#"{"a": {"k": 1}, "b": {"k": 2}}"#).unwrap();
    }

    #[test]
    fn what_the_hand_written_reader_got_wrong_is_refused_or_right() {
        for bad in ["01", "1.", "1e99999", "-1e400", "[1,]", "{\"a\" 1}", "\"\\ud800\"", "tru", "{} x", ""] {
            let p = problem(bad);
            assert!(p.key.is_none() && p.message.starts_with("is not valid JSON"), "{bad}: {p:?}");
        }
        // A surrogate pair is one code point.
        let v: serde_json::Value = parse(br#""\ud83d\ude00""#).unwrap();
        assert_eq!(v.as_str(), Some("\u{1F600}"));
    }

    #[test]
    fn files_over_the_cap_are_refused_before_parsing() {
        let dir = std::env::temp_dir().join(format!("mlx-trellis-json-cap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("big.json");
        std::fs::write(&f, vec![b' '; 1025]).unwrap();
        let e = read_capped(&f, 1024, "test files").unwrap_err();
        assert!(e.to_string().contains("is larger than 1024 bytes, the limit for test files"), "{e}");
        assert_eq!(read_capped(&f, 1025, "test files").unwrap().len(), 1025);
        let e = read_capped(&dir.join("missing.json"), 10, "x").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Io);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
