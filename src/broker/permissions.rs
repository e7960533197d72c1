//! What a refusal of the broker means for this tool's user: the AMQP `ACCESS_REFUSED` of a
//! channel and the management API's 401 for a missing user tag, each followed by the
//! permission or tag that is missing, in this tool's terms (the book's "Least privilege").
//!
//! The broker's own words are kept first (they name the resource); the hint is appended, so
//! code that tells errors apart by the broker's text still does.

/// `reply_text` of a channel the broker closed, with what the tool's user needs when it is an
/// access refusal on a queue or an exchange.
pub fn explain_amqp(reply_text: String) -> String {
    if !reply_text.starts_with("ACCESS_REFUSED") {
        return reply_text;
    }
    let hint = if reply_text.contains("to queue '") {
        // RabbitMQ 4.x refuses a passive declare without configure or read and names only
        // configure; 3.x names no permission.
        "the user needs the read permission on this queue: a backup reads it, and a restore in \
         direct-to-queue mode checks that it exists, which RabbitMQ 4.x allows with read or \
         configure"
    } else if reply_text.contains("to exchange '") {
        "the user needs the write permission on this exchange: a restore publishes to it \
         (`amq.default` is the default exchange, used by publish_mode direct-to-queue and by \
         messages that were published to it)"
    } else {
        return reply_text;
    };
    format!("{reply_text} ({hint}; see the book's \"Least privilege\")")
}

/// The hint for a management API refusal whose reason the broker gave as `reason`; empty when
/// it is not about a user tag.
pub fn explain_management(reason: &str) -> &'static str {
    match reason {
        "Not monitor user" => {
            " (the management user needs the monitoring tag: a backup lists every queue, node and \
             connection; see the book's \"Least privilege\")"
        }
        "Not management user" => {
            " (the management user needs a management tag: monitoring for a backup, management \
             for a restore; see the book's \"Least privilege\")"
        }
        "Not administrator user" => {
            " (the management user needs the administrator tag to export or import definitions; \
             without it set backup.include_definitions: false or restore.restore_definitions: \
             false; see the book's \"Least privilege\")"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_what_is_missing() {
        let q = explain_amqp(
            "ACCESS_REFUSED - configure access to queue 'c1' in vhost 'v' refused for user 'u'"
                .into(),
        );
        assert!(
            q.starts_with("ACCESS_REFUSED - configure access to queue 'c1'"),
            "{q}"
        );
        assert!(q.contains("read permission on this queue"), "{q}");
        let x = explain_amqp(
            "ACCESS_REFUSED - access to exchange 'amq.default' in vhost 'v' refused for user 'u'"
                .into(),
        );
        assert!(x.contains("write permission on this exchange"), "{x}");
        let owned = "ACCESS_REFUSED - queue 'q' in vhost 'v' owned by another connection";
        assert_eq!(explain_amqp(owned.into()), owned);
        assert_eq!(
            explain_amqp("NOT_FOUND - no queue 'q'".into()),
            "NOT_FOUND - no queue 'q'"
        );
        assert!(explain_management("Not monitor user").contains("monitoring tag"));
        assert!(explain_management("Not administrator user").contains("administrator tag"));
        assert_eq!(explain_management("Login failed"), "");
    }
}
