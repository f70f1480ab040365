//! `weir config-reference`: every public configuration struct and builder of the
//! library crates, generated from their source (the struct's doc, each public field's
//! type and doc, each public method's signature and doc) and from their `Default`
//! where they have one, so the reference cannot drift from the code
//! (`docs/config-reference.md` is its output, checked by a test). The sources are
//! compiled in (`include_str!`): the command needs no checkout.

use std::fmt::Write as _;

/// A documented item: where its source is, its Rust path, and its default's `Debug`
/// text when it has a `Default`.
struct Item {
    name: &'static str,
    path: &'static str,
    file: &'static str,
    source: &'static str,
    default: Option<fn() -> String>,
}

macro_rules! item {
    ($name:literal, $path:literal, $file:literal) => {
        Item {
            name: $name,
            path: $path,
            file: $file,
            source: include_str!(concat!("../../../", $file)),
            default: None,
        }
    };
    ($name:literal, $path:literal, $file:literal, $default:expr) => {
        Item {
            default: Some($default),
            ..item!($name, $path, $file)
        }
    };
}

fn items() -> Vec<Item> {
    vec![
        item!(
            "RuntimeBuilder",
            "weir_engine::runtime::RuntimeBuilder",
            "engine/src/runtime/mod.rs"
        ),
        item!(
            "ExchangeSpec",
            "weir_engine::graph::ExchangeSpec",
            "engine/src/graph/mod.rs",
            || format!("{:?}", weir_engine::graph::ExchangeSpec::default())
        ),
        item!(
            "DebloatConfig",
            "weir_engine::exchange::DebloatConfig",
            "engine/src/exchange/debloat.rs"
        ),
        item!(
            "WriterConfig",
            "weir_engine::exchange::WriterConfig",
            "engine/src/exchange/writer.rs",
            || format!("{:?}", weir_engine::exchange::WriterConfig::default())
        ),
        item!(
            "LocalPoolConfig",
            "weir_engine::exchange::LocalPoolConfig",
            "engine/src/exchange/pool.rs"
        ),
        item!(
            "AsyncConfig",
            "weir_engine::async_io::AsyncConfig",
            "engine/src/async_io/mod.rs"
        ),
        item!(
            "BatchConfig",
            "weir_engine::async_io::BatchConfig",
            "engine/src/async_io/batch.rs"
        ),
        item!(
            "Checkpointing",
            "weir_engine::graph::Checkpointing",
            "engine/src/graph/checkpointing.rs"
        ),
        item!(
            "CheckpointConfig",
            "weir_engine::checkpoint::CheckpointConfig",
            "engine/src/checkpoint/coordinator.rs"
        ),
        item!(
            "ServerConfig",
            "weir_net::lookup::ServerConfig",
            "net/src/connectors/lookup/server.rs",
            || format!("{:?}", weir_net::lookup::ServerConfig::default())
        ),
        item!(
            "ClientConfig",
            "weir_net::lookup::ClientConfig",
            "net/src/connectors/lookup/client.rs"
        ),
        item!(
            "RedisConfig",
            "weir_net::redis::RedisConfig",
            "net/src/connectors/redis/client.rs"
        ),
        item!(
            "StreamSourceConfig",
            "weir_net::redis::streams::StreamSourceConfig",
            "net/src/connectors/redis/streams/source.rs"
        ),
        item!(
            "StreamSinkConfig",
            "weir_net::redis::streams::StreamSinkConfig",
            "net/src/connectors/redis/streams/sink.rs"
        ),
        item!(
            "KafkaSourceConfig",
            "weir_net::kafka::KafkaSourceConfig",
            "net/src/connectors/kafka/source.rs"
        ),
        item!(
            "KafkaSinkConfig",
            "weir_net::kafka::KafkaSinkConfig",
            "net/src/connectors/kafka/sink.rs"
        ),
        item!(
            "TransportConfig",
            "weir_net::transport::TransportConfig",
            "net/src/transport/mod.rs"
        ),
    ]
}

/// The `///` lines right above line `at` (attributes between are skipped), as one
/// paragraph per blank doc line.
fn doc_above(lines: &[&str], at: usize) -> String {
    let mut docs = Vec::new();
    let mut i = at;
    while i > 0 {
        let line = lines[i - 1].trim();
        if let Some(text) = line.strip_prefix("///") {
            docs.push(text.strip_prefix(' ').unwrap_or(text));
        } else if !line.starts_with("#[") && !line.starts_with("#![") {
            break;
        }
        i -= 1;
    }
    docs.reverse();
    // The prose only: an example (a fenced block) and what follows it are left to rustdoc.
    let prose: Vec<&str> = docs
        .into_iter()
        .take_while(|line| !line.trim_start().starts_with("```"))
        .collect();
    prose.join("\n").trim_end().to_string()
}

/// Rustdoc's intra-doc links as plain code: ``[`X`](path)`` and ``[`X`]`` become `` `X` ``.
fn plain(doc: &str) -> String {
    let mut out = String::with_capacity(doc.len());
    let mut rest = doc;
    while let Some(open) = rest.find("[`") {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find("`]") else {
            out.push_str(&rest[open..]);
            return out;
        };
        out.push_str(&after[..close + 1]);
        rest = &after[close + 2..];
        if rest.starts_with('(') {
            if let Some(end) = rest.find(')') {
                rest = &rest[end + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The first paragraph of a doc, on one line, for a table cell.
fn cell(doc: &str) -> String {
    plain(doc)
        .split("\n\n")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// `Name { a: 1, b: Some(2) }` as its top-level field texts.
fn debug_fields(text: &str) -> Vec<(String, String)> {
    let Some(open) = text.find('{') else {
        return Vec::new();
    };
    let body = text[open + 1..].trim_end().trim_end_matches('}');
    let mut fields = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    let bytes = body.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            b',' if depth == 0 => {
                fields.push(&body[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    fields.push(&body[start..]);
    fields
        .into_iter()
        .filter_map(|f| {
            let (name, value) = f.split_once(':')?;
            Some((name.trim().to_string(), value.trim().to_string()))
        })
        .collect()
}

/// One item's section.
fn section(out: &mut String, item: &Item) {
    let lines: Vec<&str> = item.source.lines().collect();
    let header = lines.iter().position(|l| {
        l.strip_prefix("pub struct ").is_some_and(|rest| {
            rest.starts_with(item.name)
                && !rest[item.name.len()..].starts_with(|c: char| c.is_alphanumeric())
        })
    });
    let Some(header) = header else {
        let _ = writeln!(
            out,
            "## `{}`\n\n(not found in `{}`)\n",
            item.name, item.file
        );
        return;
    };
    let _ = writeln!(out, "## `{}`\n", item.name);
    let _ = writeln!(out, "`{}`, in `{}`.\n", item.path, item.file);
    let doc = doc_above(&lines, header);
    if !doc.is_empty() {
        let _ = writeln!(
            out,
            "{}\n",
            plain(&doc).split_whitespace().collect::<Vec<_>>().join(" ")
        );
    }
    // Public fields, to the struct's closing brace.
    let defaults = item.default.map(|d| debug_fields(&d())).unwrap_or_default();
    let mut fields = Vec::new();
    for (i, line) in lines.iter().enumerate().skip(header + 1) {
        if line.starts_with('}') {
            break;
        }
        if let Some(field) = line.strip_prefix("    pub ") {
            if let Some((name, ty)) = field.split_once(": ") {
                let ty = ty.trim_end_matches(',');
                let default = defaults
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or("—".to_string(), |(_, v)| format!("`{v}`"));
                fields.push(format!(
                    "| `{name}` | `{ty}` | {default} | {} |",
                    cell(&doc_above(&lines, i))
                ));
            }
        }
    }
    if !fields.is_empty() {
        let _ = writeln!(
            out,
            "| field | type | default | what it sets |\n|---|---|---|---|"
        );
        for f in fields {
            let _ = writeln!(out, "{f}");
        }
        let _ = writeln!(out);
    }
    // Public methods of its inherent `impl` blocks: constructors and setters.
    let mut methods = Vec::new();
    let mut inside = false;
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("impl") {
            let target = line
                .trim_end_matches('{')
                .trim()
                .rsplit(' ')
                .next()
                .unwrap_or("");
            let target = target.split('<').next().unwrap_or("");
            inside = target == item.name && !line.contains(" for ");
            continue;
        }
        if line.starts_with('}') {
            inside = false;
            continue;
        }
        if !inside {
            continue;
        }
        if let Some(sig) = line
            .strip_prefix("    pub fn ")
            .or_else(|| line.strip_prefix("    pub const fn "))
        {
            let mut signature = sig.to_string();
            let mut j = i + 1;
            while !signature.contains('{') && j < lines.len() {
                signature.push(' ');
                signature.push_str(lines[j].trim());
                j += 1;
            }
            let signature = signature
                .split('{')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .replace(", )", ")")
                .replace("( ", "(");
            methods.push(format!(
                "| `{}` | {} |",
                signature.replace('|', "\\|"),
                cell(&doc_above(&lines, i))
            ));
        }
    }
    if !methods.is_empty() {
        let _ = writeln!(out, "| method | what it does |\n|---|---|");
        for m in methods {
            let _ = writeln!(out, "{m}");
        }
        let _ = writeln!(out);
    }
}

/// The whole reference, as Markdown.
pub(crate) fn config_reference() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Every public configuration struct and builder of `weir-engine` and `weir-net`: each\n\
         public field with its type, its default where the struct has a `Default`, and its\n\
         documentation (which gives the unit and the valid range; bad values are refused\n\
         when the struct is used, with a typed error naming the setting), and each public\n\
         method. Generated by `weir config-reference` from the source and checked by a\n\
         test, so it cannot drift; the `weir` command's flags are in\n\
         [cli-reference.md](cli-reference.md).\n\n",
    );
    for item in items() {
        section(&mut out, &item);
    }
    out
}
