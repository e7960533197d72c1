//! Seeds sample queues for the README's demo and checks that a restore brought every message
//! back. Used by `scripts/demo.sh`; not part of the tool.
//!
//! ```text
//! demo seed   <amqp_base_url> <management_url> <vhost> <messages_per_queue>
//! demo verify <amqp_base_url> <source_vhost> <target_vhost>
//! ```
//! URLs carry guest/guest by default: `amqp://guest:guest@127.0.0.1:5672`, `http://127.0.0.1:15672`.

use rmq_backup::broker::amqp::{
    AmqpUrl, BasicProperties, ConnectOptions, Connection, Delivery, FieldTable, FieldValue,
};
use rmq_backup::broker::management::ManagementClient;
use std::process::ExitCode;
use std::time::Duration;

const QUEUES: [(&str, &str); 3] = [
    ("orders", "classic"),
    ("payments (quorum)", "quorum"),
    ("événements/ünïcødé", "classic"),
];

fn url(base: &str, vhost: &str) -> String {
    let enc: String = vhost
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b == b'-' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    format!("{base}/{enc}")
}

fn connect(base: &str, vhost: &str) -> Result<Connection, String> {
    let u = AmqpUrl::parse(&url(base, vhost)).map_err(|e| e.to_string())?;
    Connection::open(&ConnectOptions::new(u)).map_err(|e| e.to_string())
}

fn message(i: u64) -> (BasicProperties, Vec<u8>) {
    let headers: FieldTable = vec![
        ("order-id".into(), FieldValue::I64(i as i64)),
        ("region".into(), FieldValue::LongString(b"eu-west".to_vec())),
        (
            "amount".into(),
            FieldValue::Decimal {
                scale: 2,
                value: (i * 137 % 100_000) as u32,
            },
        ),
        (
            "flags".into(),
            FieldValue::Array(vec![
                FieldValue::Bool(i.is_multiple_of(2)),
                FieldValue::U8(7),
            ]),
        ),
        (
            "raw".into(),
            FieldValue::LongString(vec![0xde, 0xad, 0xbe, 0xef]),
        ),
        (
            "meta".into(),
            FieldValue::Table(vec![("v".into(), FieldValue::I16(-3))]),
        ),
    ];
    let props = BasicProperties {
        content_type: Some("application/json".into()),
        delivery_mode: Some(2),
        message_id: Some(format!("m-{i}")),
        timestamp: Some(1_700_000_000 + i),
        headers: Some(headers),
        ..Default::default()
    };
    let body = format!(
        "{{\"order\":{i},\"note\":\"ünïcødé ✓\",\"pad\":\"{}\"}}",
        "x".repeat((i % 900) as usize)
    );
    (props, body.into_bytes())
}

fn seed(base: &str, mgmt_url: &str, vhost: &str, n: u64) -> Result<(), String> {
    let mgmt =
        ManagementClient::new(mgmt_url, "guest", "guest", None).map_err(|e| e.to_string())?;
    let _ = mgmt.delete_vhost(vhost);
    mgmt.create_vhost(vhost).map_err(|e| e.to_string())?;
    mgmt.set_permissions(vhost, "guest")
        .map_err(|e| e.to_string())?;
    let conn = connect(base, vhost)?;
    let ch = conn.open_channel().map_err(|e| e.to_string())?;
    ch.confirm_select().map_err(|e| e.to_string())?;
    for (name, kind) in QUEUES {
        let mut args = FieldTable::new();
        if kind != "classic" {
            args.push((
                "x-queue-type".into(),
                FieldValue::LongString(kind.as_bytes().to_vec()),
            ));
        }
        ch.queue_declare(name, true, false, false, &args)
            .map_err(|e| e.to_string())?;
        for i in 0..n {
            let (props, body) = message(i);
            ch.basic_publish("", name, true, &props, &body)
                .map_err(|e| e.to_string())?;
            if ch.outstanding_confirms() > 1000 {
                ch.wait_for_confirms(500, Duration::from_secs(60))
                    .map_err(|e| e.to_string())?;
            }
        }
        ch.wait_for_confirms(0, Duration::from_secs(60))
            .map_err(|e| e.to_string())?;
        println!("seeded {n} messages into {kind} queue '{name}' in vhost {vhost}");
    }
    Ok(())
}

fn peek(conn: &Connection, queue: &str) -> Result<Vec<Delivery>, String> {
    let ch = conn.open_channel().map_err(|e| e.to_string())?;
    let depth = ch
        .queue_declare_passive(queue)
        .map_err(|e| e.to_string())?
        .message_count as usize;
    let mut out = Vec::new();
    let mut channels = Vec::new();
    while out.len() < depth {
        let window = (depth - out.len()).min(65_535);
        let c = conn.open_channel().map_err(|e| e.to_string())?;
        c.basic_qos(window as u16, false)
            .map_err(|e| e.to_string())?;
        let consumer = c
            .basic_consume(queue, "demo-verify", false, false, &FieldTable::new())
            .map_err(|e| e.to_string())?;
        for _ in 0..window {
            match consumer
                .recv_timeout(Duration::from_secs(30))
                .map_err(|e| e.to_string())?
            {
                Some(d) => out.push(d),
                None => return Err(format!("queue {queue}: delivery timed out")),
            }
        }
        channels.push(c);
    }
    for c in channels {
        let _ = c.close();
    }
    Ok(out)
}

fn sorted(p: &BasicProperties) -> BasicProperties {
    let mut p = p.clone();
    if let Some(h) = p.headers.as_mut() {
        h.retain(|(k, _)| k != "x-delivery-count");
        h.sort_by(|a, b| a.0.cmp(&b.0));
    }
    p
}

fn verify(base: &str, source: &str, target: &str) -> Result<bool, String> {
    let s = connect(base, source)?;
    let t = connect(base, target)?;
    let mut ok = true;
    println!(
        "{:<24} {:>8} {:>8} {:>10}",
        "QUEUE", "SOURCE", "RESTORED", "IDENTICAL"
    );
    for (name, _) in QUEUES {
        let a = peek(&s, name)?;
        let b = peek(&t, name)?;
        let same = a.len() == b.len()
            && a.iter()
                .zip(&b)
                .all(|(x, y)| x.body == y.body && sorted(&x.properties) == sorted(&y.properties));
        ok &= same;
        println!(
            "{:<24} {:>8} {:>8} {:>10}",
            name,
            a.len(),
            b.len(),
            if same { "yes" } else { "NO" }
        );
    }
    Ok(ok)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("seed") if args.len() == 6 => {
            let n = args[5].parse().unwrap_or(1000);
            seed(&args[2], &args[3], &args[4], n).map(|()| true)
        }
        Some("verify") if args.len() == 5 => verify(&args[2], &args[3], &args[4]),
        _ => Err("usage: demo seed <amqp_base> <management_url> <vhost> <n> | demo verify <amqp_base> <source_vhost> <target_vhost>".into()),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("some messages differ");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
