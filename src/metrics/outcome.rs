//! [`GaugeFamily`]: the gauges of a run's outcome (`broker_backup_last_*`, label `mode`), set
//! once as the run ends ([`super::Metrics::run_ended`]).

use super::{escape_label_value, header, lock};
use std::fmt::Write as _;
use std::sync::Mutex;

/// A gauge family with one label holding floating-point values, set a few times per run (the
/// outcome of a run), never on a hot path. A label value has a series once it is set.
#[derive(Debug)]
pub struct GaugeFamily {
    name: &'static str,
    help: &'static str,
    label: &'static str,
    series: Mutex<Vec<(String, f64)>>,
}

impl GaugeFamily {
    pub(super) fn new(name: &'static str, help: &'static str, label: &'static str) -> Self {
        GaugeFamily {
            name,
            help,
            label,
            series: Mutex::new(Vec::new()),
        }
    }

    /// Sets the series of `value` (the label's value) to `v`.
    pub fn set(&self, value: &str, v: f64) {
        let mut series = lock(&self.series);
        match series.iter_mut().find(|(l, _)| l == value) {
            Some((_, old)) => *old = v,
            None => series.push((value.to_string(), v)),
        }
    }

    /// The value of the series of `value`, if set.
    pub fn get(&self, value: &str) -> Option<f64> {
        lock(&self.series)
            .iter()
            .find(|(l, _)| l == value)
            .map(|(_, v)| *v)
    }

    /// The metric name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub(super) fn render(&self, out: &mut String) {
        header(out, self.name, self.help, "gauge");
        let mut series = lock(&self.series).clone();
        series.sort_by(|a, b| a.0.cmp(&b.0));
        for (value, v) in series {
            out.push_str(self.name);
            out.push('{');
            out.push_str(self.label);
            out.push_str("=\"");
            escape_label_value(&value, out);
            let _ = writeln!(out, "\"}} {v}");
        }
    }
}
