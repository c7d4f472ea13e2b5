//! Chat templates: the model's own Jinja template (GGUF `tokenizer.chat_template`) rendered
//! with minijinja.

use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::{InferError, Result};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// Renders `messages` with `template`; `add_generation_prompt` opens the assistant's turn.
/// Templates get `raise_exception(msg)`, `strftime_now(format)` (today, UTC), `tojson`, and
/// loop controls (`break`, `continue`).
pub fn render_chat(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    render_chat_at(
        template,
        messages,
        add_generation_prompt,
        bos_token,
        eos_token,
        now,
    )
}

/// [`render_chat`] with `strftime_now` answering for `unix_seconds` (reproducible renderings).
pub fn render_chat_at(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
    unix_seconds: i64,
) -> Result<String> {
    let mut env = Environment::new();
    // As Hugging Face renders chat templates (and their authors test them).
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.add_function(
        "raise_exception",
        |msg: String| -> Result<String, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
        },
    );
    env.add_function("strftime_now", move |format: String| {
        strftime(&format, unix_seconds)
    });
    env.add_filter("tojson", tojson);
    env.add_template("chat", template)
        .map_err(|e| InferError::Template(e.to_string()))?;
    let tmpl = env
        .get_template("chat")
        .map_err(|e| InferError::Template(e.to_string()))?;
    tmpl.render(minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
    })
    .map_err(|e| InferError::Template(e.to_string()))
}

/// `tojson` as Hugging Face's templates get it: Python's `json.dumps(x, ensure_ascii=False,
/// indent=indent)` (separators `", "` and `": "`, or newlines and `indent` spaces).
fn tojson(
    value: minijinja::Value,
    kwargs: minijinja::value::Kwargs,
) -> Result<minijinja::Value, JinjaError> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_json(&json, indent, 0, &mut out);
    Ok(minijinja::Value::from_safe_string(out))
}

fn write_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        // Scalars and empty containers print as JSON does ("[]", "{}"); serde_json keeps
        // non-ASCII characters as they are, like ensure_ascii=False.
        other => out.push_str(&other.to_string()),
    }
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// Python's `strftime` for the specifiers chat templates use (`%d %m %Y %y %b %B %a %A %H %M
/// %S %j %%`; others are kept as written), in UTC.
fn strftime(format: &str, unix_seconds: i64) -> String {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy_mar = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy_mar + 2) / 153;
    let day = doy_mar - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('H') => out.push_str(&format!("{:02}", secs / 3600)),
            Some('M') => out.push_str(&format!("{:02}", secs / 60 % 60)),
            Some('S') => out.push_str(&format!("{:02}", secs % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::strftime;

    #[test]
    fn strftime_matches_known_dates() {
        // 2024-07-26 12:34:56 UTC, a Friday; 2000-02-29; 1970-01-01.
        assert_eq!(
            strftime("%d %b %Y %H:%M:%S %A %j", 1_721_997_296),
            "26 Jul 2024 12:34:56 Friday 208"
        );
        assert_eq!(
            strftime("%Y-%m-%d %a %B", 951_782_400),
            "2000-02-29 Tue February"
        );
        assert_eq!(strftime("%d/%m/%y %%", 0), "01/01/70 %");
    }
}
