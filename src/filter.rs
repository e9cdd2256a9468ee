//! A route's filter: which events its target wants, from what senders put in them — a
//! JSON pointer into the body or a request header, equal to a value, one of a list,
//! starting with a prefix, or present. Every condition of a filter must hold.
//!
//! Pure: [`Filter::check`] says what is wrong with a filter as written (at config load),
//! [`Filter::accepts`] reads one request's headers and body. It never claims or logs.

use actix_web::http::header::{HeaderMap, HeaderName};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::canonical::Body;

/// Most values in one condition's `in` list.
pub const MAX_CHOICES: usize = 64;

/// Most conditions in one filter.
pub const MAX_CONDITIONS: usize = 16;

/// Every condition must hold for the event to be accepted. Written as one table or a list
/// of tables (`filter = { json = "/type", prefix = "invoice." }`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "Written", into = "Vec<Condition>")]
pub struct Filter {
    /// The conditions, all of which must hold.
    pub all: Vec<Condition>,
}

/// A filter as a config file writes it: one condition or a list. Read by hand, not as an
/// untagged enum, so a mistake inside a condition keeps its own message (an unknown test
/// is named, with the ones there are).
struct Written(Vec<Condition>);

impl<'de> Deserialize<'de> for Written {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Written;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a condition (a table) or a list of conditions")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Written, A::Error> {
                let one =
                    Condition::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(Written(vec![one]))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Written, A::Error> {
                Vec::deserialize(serde::de::value::SeqAccessDeserializer::new(seq)).map(Written)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl From<Written> for Filter {
    fn from(written: Written) -> Self {
        Self { all: written.0 }
    }
}

impl From<Filter> for Vec<Condition> {
    fn from(filter: Filter) -> Self {
        filter.all
    }
}

/// One condition: a place in the request (`json` or `header`) and a test of what is there
/// (`equals`, `in`, `prefix` or `exists`). Exactly one of each is given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// An RFC 6901 JSON pointer into the body, e.g. `/type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub json: Option<String>,
    /// A request header, matched case-insensitively, e.g. `X-GitHub-Event`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header: Option<String>,
    /// The value there is this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub equals: Option<Scalar>,
    /// The value there is one of these.
    #[serde(default, rename = "in", skip_serializing_if = "Option::is_none")]
    pub one_of: Option<Vec<Scalar>>,
    /// The value there is a string starting with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// Something is there (`true`; a JSON `null` counts) or nothing is (`false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exists: Option<bool>,
}

/// A value a condition compares with: a string, an integer or a boolean.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    /// A boolean; matches JSON `true` / `false`.
    Bool(bool),
    /// An integer; matches a JSON number written as this integer.
    Int(i64),
    /// A string; matches a JSON string or a header's value.
    Str(String),
}

impl Scalar {
    /// Whether the JSON value `found` is this value.
    fn matches_json(&self, found: &Value) -> bool {
        match (self, found) {
            (Scalar::Bool(b), Value::Bool(f)) => b == f,
            (Scalar::Int(i), Value::Number(n)) => n.to_string() == i.to_string(),
            (Scalar::Str(s), Value::String(f)) => s == f,
            _ => false,
        }
    }
}

impl std::fmt::Display for Scalar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// One line for `check-config`: `json /type in ["invoice.paid", "invoice.payment_failed"]
/// and header X-GitHub-Event = "push"`.
impl std::fmt::Display for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, c) in self.all.iter().enumerate() {
            if i > 0 {
                f.write_str(" and ")?;
            }
            match (&c.json, &c.header) {
                (Some(pointer), _) => write!(f, "json {pointer}")?,
                (None, Some(name)) => write!(f, "header {name}")?,
                (None, None) => f.write_str("?")?,
            }
            if let Some(v) = &c.equals {
                write!(f, " = {v}")?;
            }
            if let Some(choices) = &c.one_of {
                let listed: Vec<String> = choices.iter().map(ToString::to_string).collect();
                write!(f, " in [{}]", listed.join(", "))?;
            }
            if let Some(prefix) = &c.prefix {
                write!(f, " starts with {prefix:?}")?;
            }
            match c.exists {
                Some(true) => f.write_str(" exists")?,
                Some(false) => f.write_str(" is absent")?,
                None => {}
            }
        }
        Ok(())
    }
}

/// What is at a condition's place in one request.
enum Found<'a> {
    Nothing,
    Json(&'a Value),
    Header(&'a str),
}

impl Filter {
    /// What is wrong with this filter as written, for the config error (`None`: nothing).
    pub fn check(&self) -> Option<String> {
        if self.all.is_empty() {
            return Some("a filter needs at least one condition".into());
        }
        if self.all.len() > MAX_CONDITIONS {
            return Some(format!(
                "a filter has at most {MAX_CONDITIONS} conditions, not {}",
                self.all.len()
            ));
        }
        self.all
            .iter()
            .enumerate()
            .find_map(|(i, c)| c.check().map(|e| format!("condition {}: {e}", i + 1)))
    }

    /// The request headers its conditions read (kept with the event's row, so that a job
    /// giving old events to a route can check them again).
    pub fn headers(&self) -> impl Iterator<Item = &str> {
        self.all.iter().filter_map(|c| c.header.as_deref())
    }

    /// Whether the request with these headers and this body passes every condition.
    pub fn accepts(&self, headers: &HeaderMap, body: &Body<'_>) -> bool {
        self.all.iter().all(|c| c.holds(headers, body))
    }
}

impl Condition {
    /// What is wrong with this condition as written (`None`: nothing).
    fn check(&self) -> Option<String> {
        match (&self.json, &self.header) {
            (Some(_), Some(_)) | (None, None) => {
                return Some("give exactly one of `json` (a pointer) or `header`".into())
            }
            (Some(pointer), None) if !pointer.is_empty() && !pointer.starts_with('/') => {
                return Some(format!(
                    "`json` must be a JSON pointer starting with `/` (`/{pointer}`?), not {pointer:?}"
                ))
            }
            (None, Some(name)) if HeaderName::from_bytes(name.as_bytes()).is_err() => {
                return Some(format!("`header` is not a header name: {name:?}"))
            }
            _ => {}
        }
        let tests = [
            self.equals.is_some(),
            self.one_of.is_some(),
            self.prefix.is_some(),
            self.exists.is_some(),
        ];
        if tests.iter().filter(|t| **t).count() != 1 {
            return Some("give exactly one of `equals`, `in`, `prefix` or `exists`".into());
        }
        if let Some(choices) = &self.one_of {
            if choices.is_empty() || choices.len() > MAX_CHOICES {
                return Some(format!(
                    "`in` lists 1 to {MAX_CHOICES} values, not {}",
                    choices.len()
                ));
            }
        }
        let compared = self.equals.iter().chain(self.one_of.iter().flatten());
        if self.header.is_some() && compared.into_iter().any(|v| !matches!(v, Scalar::Str(_))) {
            return Some("a header's value is text: compare it with strings".into());
        }
        None
    }

    /// Whether this condition holds for one request.
    fn holds(&self, headers: &HeaderMap, body: &Body<'_>) -> bool {
        let found = match (&self.json, &self.header) {
            (Some(pointer), _) => body
                .json()
                .and_then(|v| v.pointer(pointer))
                .map_or(Found::Nothing, Found::Json),
            (None, Some(name)) => headers
                .get(name.as_str())
                .and_then(|v| v.to_str().ok())
                .map_or(Found::Nothing, Found::Header),
            (None, None) => Found::Nothing,
        };
        if let Some(wanted) = self.exists {
            return wanted != matches!(found, Found::Nothing);
        }
        let is = |value: &Scalar| match (&found, value) {
            (Found::Json(json), _) => value.matches_json(json),
            (Found::Header(text), Scalar::Str(s)) => text == s,
            _ => false,
        };
        if let Some(value) = &self.equals {
            return is(value);
        }
        if let Some(choices) = &self.one_of {
            return choices.iter().any(is);
        }
        if let Some(prefix) = &self.prefix {
            return match found {
                Found::Json(Value::String(s)) => s.starts_with(prefix.as_str()),
                Found::Header(text) => text.starts_with(prefix.as_str()),
                _ => false,
            };
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::HeaderValue;

    fn filter(toml_text: &str) -> Filter {
        #[derive(Deserialize)]
        struct Holder {
            filter: Filter,
        }
        toml::from_str::<Holder>(toml_text)
            .expect("a filter")
            .filter
    }

    fn accepts(f: &Filter, header: Option<(&'static str, &'static str)>, body: &str) -> bool {
        let mut headers = HeaderMap::new();
        if let Some((name, value)) = header {
            headers.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        f.accepts(&headers, &Body::new(body.as_bytes()))
    }

    #[test]
    fn a_pointer_equal_to_one_of_a_list() {
        let f = filter(
            r#"filter = { json = "/type", in = ["invoice.paid", "invoice.payment_failed"] }"#,
        );
        assert_eq!(f.check(), None);
        assert!(accepts(&f, None, r#"{"type":"invoice.paid"}"#));
        assert!(accepts(&f, None, r#"{"type":"invoice.payment_failed"}"#));
        assert!(!accepts(&f, None, r#"{"type":"invoice.created"}"#));
        assert!(!accepts(&f, None, r#"{"kind":"invoice.paid"}"#));
        assert!(!accepts(&f, None, "not json"));
    }

    #[test]
    fn a_prefix_an_equal_value_and_presence() {
        let prefix = filter(r#"filter = { json = "/type", prefix = "customer." }"#);
        assert!(accepts(&prefix, None, r#"{"type":"customer.created"}"#));
        assert!(!accepts(&prefix, None, r#"{"type":"charge.succeeded"}"#));
        assert!(!accepts(&prefix, None, r#"{"type":7}"#));
        let live = filter(r#"filter = { json = "/livemode", equals = true }"#);
        assert!(accepts(&live, None, r#"{"livemode":true}"#));
        assert!(!accepts(&live, None, r#"{"livemode":"true"}"#));
        let version = filter(r#"filter = { json = "/data/0/v", equals = 2 }"#);
        assert!(accepts(&version, None, r#"{"data":[{"v":2}]}"#));
        assert!(!accepts(&version, None, r#"{"data":[{"v":2.5}]}"#));
        let has = filter(r#"filter = { json = "/data/object/id", exists = true }"#);
        assert!(accepts(&has, None, r#"{"data":{"object":{"id":null}}}"#));
        assert!(!accepts(&has, None, r#"{"data":{}}"#));
        let lacks = filter(r#"filter = { json = "/test", exists = false }"#);
        assert!(accepts(&lacks, None, "{}"));
        assert!(!accepts(&lacks, None, r#"{"test":1}"#));
    }

    #[test]
    fn a_header_and_every_condition_of_a_list() {
        let f = filter(
            r#"filter = [{ header = "X-GitHub-Event", in = ["push", "pull_request"] },
                         { json = "/ref", prefix = "refs/heads/" }]"#,
        );
        assert_eq!(f.check(), None);
        assert_eq!(
            f.to_string(),
            r#"header X-GitHub-Event in ["push", "pull_request"] and json /ref starts with "refs/heads/""#
        );
        let push = Some(("x-github-event", "push"));
        assert!(accepts(&f, push, r#"{"ref":"refs/heads/main"}"#));
        assert!(!accepts(&f, push, r#"{"ref":"refs/tags/v1"}"#));
        assert!(!accepts(
            &f,
            Some(("x-github-event", "ping")),
            r#"{"ref":"refs/heads/main"}"#
        ));
        assert!(!accepts(&f, None, r#"{"ref":"refs/heads/main"}"#));
    }

    #[test]
    fn a_filter_written_wrong_is_named() {
        let wrong = |text: &str| filter(text).check().expect("an error");
        assert!(wrong(r#"filter = { json = "type", equals = "x" }"#).contains("`/type`"));
        assert!(
            wrong(r#"filter = { json = "/a", header = "B", exists = true }"#)
                .contains("exactly one of `json`")
        );
        assert!(wrong(r#"filter = { json = "/a" }"#).contains("exactly one of `equals`"));
        assert!(
            wrong(r#"filter = { json = "/a", equals = 1, prefix = "x" }"#)
                .contains("exactly one of `equals`")
        );
        assert!(wrong(r#"filter = { json = "/a", in = [] }"#).contains("1 to 64"));
        assert!(
            wrong(r#"filter = { header = "a b", exists = true }"#).contains("not a header name")
        );
        assert!(wrong(r#"filter = { header = "X-N", equals = 3 }"#).contains("strings"));
        assert!(wrong("filter = []").contains("at least one"));
        let many = format!(
            "filter = [{}]",
            vec![r#"{ json = "/a", exists = true }"#; 17].join(",")
        );
        assert!(wrong(&many).contains("at most 16"));
        let long: Vec<String> = (0..65).map(|i| format!("\"v{i}\"")).collect();
        assert!(wrong(&format!(
            r#"filter = {{ json = "/a", in = [{}] }}"#,
            long.join(",")
        ))
        .contains("not 65"));
        #[derive(Deserialize, Debug)]
        struct Holder {
            #[allow(dead_code)]
            filter: Filter,
        }
        let unknown = r#"filter = [{ json = "/a", matches = "x" }]"#;
        let error = toml::from_str::<Holder>(unknown).unwrap_err().to_string();
        assert!(error.contains("unknown field `matches`"), "{error}");
    }

    #[test]
    fn a_filter_prints_as_a_list_that_reads_back_the_same() {
        let f = filter(r#"filter = { json = "/type", in = ["a", 1, true] }"#);
        #[derive(Serialize)]
        struct Holder<'a> {
            filter: &'a Filter,
        }
        let printed = toml::to_string(&Holder { filter: &f }).unwrap();
        assert_eq!(filter(&printed), f, "{printed}");
    }
}
