//! The little XML the Blob service answers with: List Blobs pages and error codes, read
//! without an XML library.

use percent_encoding::percent_decode_str;

/// Iterates over the elements `<tag ...>inner</tag>` (and empty `<tag/>`) of `xml` in order,
/// giving (attribute text, raw inner text). Only for answers whose text content is escaped, as
/// Azure's are: a raw `<` is always markup.
pub(super) fn elements<'x>(
    xml: &'x str,
    tag: &'x str,
) -> impl Iterator<Item = (&'x str, &'x str)> + 'x {
    let open = format!("<{tag}");
    let close = format!("</{tag}>");
    let mut pos = 0;
    std::iter::from_fn(move || loop {
        let start = pos + xml.get(pos..)?.find(&open)?;
        let after = start + open.len();
        let next = xml[after..].chars().next()?;
        if !matches!(next, '>' | '/' | ' ' | '\t' | '\r' | '\n') {
            pos = after;
            continue;
        }
        let gt = after + xml[after..].find('>')?;
        let attrs = &xml[after..gt];
        if attrs.ends_with('/') {
            pos = gt + 1;
            return Some((attrs.trim_end_matches('/'), ""));
        }
        let end = gt + 1 + xml[gt + 1..].find(&close)?;
        pos = end + close.len();
        return Some((attrs, &xml[gt + 1..end]));
    })
}

/// Decodes the five XML entities and numeric character references.
pub(super) fn decode_entities(s: &str) -> std::result::Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let semi = rest[amp..]
            .find(';')
            .ok_or_else(|| "unterminated entity".to_string())?;
        let name = &rest[amp + 1..amp + semi];
        let c = match name {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) =
                    name.strip_prefix("#x").or_else(|| name.strip_prefix("#X"))
                {
                    u32::from_str_radix(hex, 16).ok()
                } else if let Some(dec) = name.strip_prefix('#') {
                    dec.parse::<u32>().ok()
                } else {
                    None
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| format!("unknown entity &{};", name.escape_debug()))?
            }
        };
        out.push(c);
        rest = &rest[amp + semi + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Parses one List Blobs page: blob names (entities decoded; `Encoded="true"` names
/// percent-decoded) and the next marker (`None` when empty or absent).
/// One page of List Blobs: each blob's name and `Last-Modified` (epoch ms, when present and
/// readable), and the marker of the next page.
pub(super) type ListPage = (Vec<(String, Option<i64>)>, Option<String>);

/// Epoch ms of an RFC 1123 HTTP date as Azure writes `Last-Modified`
/// (`Thu, 26 Nov 2026 02:27:42 GMT`); `None` for anything else.
pub(super) fn parse_http_date(s: &str) -> Option<i64> {
    let parts: Vec<&str> = s.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = MONTHS.iter().position(|x| x == month)? as u32 + 1;
    let d: u32 = day.parse().ok()?;
    let y: i64 = year.parse().ok()?;
    let hms: Vec<i64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, mi, sec] = hms.as_slice() else {
        return None;
    };
    let days = crate::run::units::days_from_civil(y, m, d);
    Some(((days * 24 + h) * 60 + mi) * 60_000 + sec * 1000)
}

pub(super) fn parse_list_page(xml: &str) -> std::result::Result<ListPage, String> {
    if !xml.contains("<EnumerationResults") {
        return Err("not a List Blobs answer".into());
    }
    let mut names = Vec::new();
    for (_, blob) in elements(xml, "Blob") {
        let (attrs, raw) = elements(blob, "Name")
            .next()
            .ok_or_else(|| "blob without Name".to_string())?;
        let mut name = decode_entities(raw)?;
        if attrs.replace(' ', "").contains("Encoded=\"true\"") {
            name = percent_decode_str(&name)
                .decode_utf8()
                .map_err(|_| "undecodable blob name".to_string())?
                .into_owned();
        }
        let modified = elements(blob, "Last-Modified")
            .next()
            .and_then(|(_, raw)| parse_http_date(raw.trim()));
        names.push((name, modified));
    }
    // The marker follows the Blobs element; search after it so no blob can shadow it.
    let tail = xml.rfind("</Blobs>").map_or(xml, |i| &xml[i..]);
    let next = match elements(tail, "NextMarker").next() {
        Some((_, raw)) => Some(decode_entities(raw)?).filter(|m| !m.is_empty()),
        None => None,
    };
    Ok((names, next))
}
