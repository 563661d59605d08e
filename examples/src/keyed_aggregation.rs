//! A keyed running aggregation over generated sensor readings: key by sensor, keep count,
//! sum, minimum and maximum per sensor, and report a sensor's statistics every
//! `report_every` readings.

use std::fmt;

use weir_engine::prelude::*;

use crate::Output;

/// Running statistics of one sensor.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct SensorStats {
    /// The sensor.
    pub sensor: u32,
    /// Readings seen.
    pub count: u64,
    /// Sum of readings, in milli-degrees.
    pub sum: i64,
    /// Lowest reading.
    pub min: i64,
    /// Highest reading.
    pub max: i64,
}

impl fmt::Display for SensorStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sensor {:>4}: {:>9} readings, mean {:>7.3}, min {:>7.3}, max {:>7.3}",
            self.sensor,
            self.count,
            self.sum as f64 / self.count as f64 / 1000.0,
            self.min as f64 / 1000.0,
            self.max as f64 / 1000.0
        )
    }
}

/// Reading `i`: a sensor id and a temperature in milli-degrees, deterministic in `i`.
pub fn reading(i: u64, sensors: u32) -> SensorStats {
    let mixed = i.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17);
    let sensor = (mixed % u64::from(sensors)) as u32;
    let temperature = 15_000 + ((mixed >> 20) % 20_000) as i64 - 5_000;
    SensorStats {
        sensor,
        count: 1,
        sum: temperature,
        min: temperature,
        max: temperature,
    }
}

/// The reports of the aggregation over `events` generated readings from `sensors` sensors.
pub fn reports(
    env: &StreamEnvironment,
    events: u64,
    sensors: u32,
    report_every: u64,
) -> DataStream<SensorStats> {
    let sensors = sensors.max(1);
    let report_every = report_every.max(1);
    env.from_source(
        DataGeneratorSource::new(Some(events), move |i| reading(i, sensors)),
        WatermarkStrategy::no_watermarks(),
        "sensor readings",
    )
    .uid("sensor-readings")
    .key_by(|r: &SensorStats| r.sensor)
    .reduce(|a, b| SensorStats {
        sensor: a.sensor,
        count: a.count + b.count,
        sum: a.sum + b.sum,
        min: a.min.min(b.min),
        max: a.max.max(b.max),
    })
    .name("Running stats")
    .uid("running-stats")
    .filter(move |s: &SensorStats| s.count.is_multiple_of(report_every))
    .name("Every report")
}

/// Adds the aggregation to `env`, writing its reports to `output`.
pub fn build(
    env: &StreamEnvironment,
    events: u64,
    sensors: u32,
    report_every: u64,
    output: Output,
) {
    let stats = reports(env, events, sensors, report_every);
    match output {
        Output::Print => stats.sink_to(PrintSink::new(), "print"),
        Output::Files(dir) => stats.sink_to(FileSink::lines(dir), "files"),
        Output::Discard => stats.sink_to(DiscardSink::new(), "discard"),
    };
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn reports_match_a_direct_aggregation() {
        let (events, sensors, every) = (50_000, 7, 1_000);
        let env = StreamEnvironment::new(Configuration::default()).unwrap();
        let (sink, collected) = CollectSink::new();
        reports(&env, events, sensors, every).sink_to(sink, "collect");
        env.execute("aggregation").unwrap();

        let mut per_sensor: HashMap<u32, Vec<i64>> = HashMap::new();
        for i in 0..events {
            let r = reading(i, sensors);
            per_sensor.entry(r.sensor).or_default().push(r.sum);
        }
        let reports = collected.records();
        let expected_reports: u64 = per_sensor.values().map(|v| v.len() as u64 / every).sum();
        assert_eq!(reports.len() as u64, expected_reports);
        // Readings of one sensor reach one subtask in generation order per source subtask, so
        // the counts reported are exact; check every report's count is a multiple and that the
        // largest report per sensor agrees with the direct count.
        for report in &reports {
            assert_eq!(report.count % every, 0);
            let all = &per_sensor[&report.sensor];
            assert!(report.count <= all.len() as u64);
            assert!(
                report.min >= *all.iter().min().unwrap()
                    && report.max <= *all.iter().max().unwrap()
            );
        }
        for (sensor, all) in &per_sensor {
            let last = reports
                .iter()
                .filter(|r| r.sensor == *sensor)
                .map(|r| r.count)
                .max()
                .unwrap_or(0);
            assert_eq!(last, all.len() as u64 / every * every);
        }
    }
}
