//! Where an HTTP worker publishes its KV-cache events (ZMQ, vLLM's and SGLang's
//! `--kv-events-config`): declared with `--kv-events WORKER_URL=ENDPOINT[;replay=ENDPOINT]
//! [;topic=TOPIC]` or `POST /workers` `"kv_events": {"endpoint", "replay_endpoint", "topic"}`.

/// A worker's event publisher.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KvEventsSource {
    /// The PUB socket (`tcp://host:port`).
    pub endpoint: String,
    /// The ROUTER socket that replays missed batches; None: a gap rebuilds instead.
    pub replay: Option<String>,
    /// The topic subscribed to (empty: every message).
    pub topic: String,
}

fn endpoint(what: &str, e: &str) -> Result<String, String> {
    let rest = e.strip_prefix("tcp://").ok_or_else(|| format!("{what}: '{e}' is not a tcp:// endpoint"))?;
    if rest.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()) {
        return Err(format!("{what}: '{e}' is not tcp://host:port"));
    }
    Ok(e.to_string())
}

impl KvEventsSource {
    /// One `--kv-events` value: (the worker's URL, its publisher).
    pub fn parse_flag(v: &str) -> Result<(String, KvEventsSource), String> {
        // The worker URL has a scheme too: the first '=' after it splits.
        let (url, rest) = v.split_once('=').ok_or_else(|| format!("--kv-events: '{v}' is not WORKER_URL=ENDPOINT"))?;
        let mut parts = rest.split(';');
        let mut s = KvEventsSource {
            endpoint: endpoint("--kv-events", parts.next().unwrap_or_default())?,
            ..Default::default()
        };
        for p in parts {
            match p.split_once('=') {
                Some(("replay", e)) => s.replay = Some(endpoint("--kv-events replay", e)?),
                Some(("topic", t)) => s.topic = t.to_string(),
                _ => return Err(format!("--kv-events: unknown option '{p}' (replay=…, topic=…)")),
            }
        }
        Ok((url.trim_end_matches('/').to_string(), s))
    }

    /// `POST /workers`' `kv_events` object.
    pub fn from_json(v: &sonic_rs::Value) -> Result<KvEventsSource, String> {
        use sonic_rs::JsonValueTrait;
        let text = |name: &str| -> Result<Option<String>, String> {
            match v.get(name) {
                None => Ok(None),
                Some(x) if x.is_null() => Ok(None),
                Some(x) => x
                    .as_str()
                    .map(|s| Some(s.to_string()))
                    .ok_or_else(|| format!("`kv_events.{name}` must be a string")),
            }
        };
        let e = text("endpoint")?.ok_or("`kv_events.endpoint` is required")?;
        Ok(KvEventsSource {
            endpoint: endpoint("`kv_events.endpoint`", &e)?,
            replay: text("replay_endpoint")?.map(|r| endpoint("`kv_events.replay_endpoint`", &r)).transpose()?,
            topic: text("topic")?.unwrap_or_default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_and_the_json_say_the_same() {
        let (url, s) =
            KvEventsSource::parse_flag("http://10.0.0.5:8000=tcp://10.0.0.5:5557;replay=tcp://10.0.0.5:5558;topic=kv")
                .unwrap();
        assert_eq!(url, "http://10.0.0.5:8000");
        let want = KvEventsSource {
            endpoint: "tcp://10.0.0.5:5557".into(),
            replay: Some("tcp://10.0.0.5:5558".into()),
            topic: "kv".into(),
        };
        assert_eq!(s, want);
        let v: sonic_rs::Value = sonic_rs::from_str(
            r#"{"endpoint":"tcp://10.0.0.5:5557","replay_endpoint":"tcp://10.0.0.5:5558","topic":"kv"}"#,
        )
        .unwrap();
        assert_eq!(KvEventsSource::from_json(&v).unwrap(), want);
        let (_, bare) = KvEventsSource::parse_flag("http://h:1=tcp://h:2").unwrap();
        assert_eq!((bare.replay, bare.topic.as_str()), (None, ""));
        for bad in ["http://h:1", "http://h:1=udp://h:2", "http://h:1=tcp://h", "http://h:1=tcp://h:2;nope=1"] {
            assert!(KvEventsSource::parse_flag(bad).is_err(), "{bad}");
        }
    }
}
