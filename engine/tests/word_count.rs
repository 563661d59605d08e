//! Word count over a text file: a file source, a flat_map splitting lines into lowercase
//! words, a key_by on the word and a running reduce, checked against counts computed here.

mod common;

use std::collections::HashMap;
use std::io::Write;

use common::XorShift;
use weir_engine::prelude::*;

const VOCABULARY: &[&str] = &[
    "the",
    "Stream",
    "weir",
    "FLINK",
    "shard",
    "core",
    "barrier",
    "Watermark",
    "key",
    "group",
    "state",
    "river",
    "flows",
    "over",
    "a",
    "low",
    "dam",
    "records",
    "pass",
    "segment",
];

/// Writes a text of `lines` lines of words in mixed case with punctuation and blank lines, and
/// returns it.
fn write_text(file: &mut impl Write, lines: usize) -> String {
    let mut rng = XorShift::new(7);
    let mut text = String::new();
    for line in 0..lines {
        if line % 17 == 5 {
            text.push('\n');
            continue;
        }
        let words = 1 + rng.below(12);
        for w in 0..words {
            if w > 0 {
                text.push_str(if rng.below(5) == 0 { ", " } else { " " });
            }
            text.push_str(VOCABULARY[rng.below(VOCABULARY.len() as u64) as usize]);
        }
        text.push_str(if line.is_multiple_of(3) { ".\n" } else { "\n" });
    }
    file.write_all(text.as_bytes()).expect("write the text");
    text
}

fn words_of(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

#[test]
fn word_count_matches_a_hash_map_reference() {
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    let text = write_text(&mut file, 3_000);
    file.flush().expect("flush the text");

    let mut reference: HashMap<String, u64> = HashMap::new();
    for word in text.lines().flat_map(words_of) {
        *reference.entry(word).or_insert(0) += 1;
    }
    let total_words: u64 = reference.values().sum();
    assert!(
        total_words > 10_000,
        "the text is big enough to span many batches"
    );

    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_source(
        FileSource::text_lines(file.path()),
        WatermarkStrategy::no_watermarks(),
        "text",
    )
    .flat_map(|line: String, out: &mut Collector<'_, String>| {
        for word in words_of(&line) {
            out.collect(word);
        }
    })
    .name("tokenize")
    .map(|word: String| (word, 1u64))
    .key_by(|(word, _): &(String, u64)| word.clone())
    .reduce(|(word, a): (String, u64), (_, b): (String, u64)| (word, a + b))
    .name("count")
    .sink_to(sink, "counts");
    let result = env.execute("word count").expect("the job succeeds");

    // One running-reduce output per word.
    let outputs = collected.records();
    assert_eq!(outputs.len() as u64, total_words);
    assert_eq!(result.records_out("count"), total_words);
    assert_eq!(result.records_out("tokenize"), total_words);
    assert_eq!(result.records_in("Sink: counts"), total_words);
    assert_eq!(
        result.records_out("Source: text"),
        text.lines().count() as u64
    );

    // The final count of a word is the largest value its running reduce emitted.
    let mut finals: HashMap<String, u64> = HashMap::new();
    for (word, count) in &outputs {
        let best = finals.entry(word.clone()).or_insert(0);
        *best = (*best).max(*count);
    }
    assert_eq!(finals, reference);

    // Each word is counted in one subtask, whose running values are exactly 1, 2, ..., n in order.
    let mut seen_in: HashMap<String, usize> = HashMap::new();
    for (subtask, records) in collected.by_subtask().iter().enumerate() {
        let mut next: HashMap<&str, u64> = HashMap::new();
        for (word, count) in records {
            let expected = next.entry(word).or_insert(0);
            *expected += 1;
            assert_eq!(
                *count, *expected,
                "running count of '{word}' in subtask {subtask}"
            );
            let owner = *seen_in.entry(word.clone()).or_insert(subtask);
            assert_eq!(owner, subtask, "'{word}' was counted in two subtasks");
        }
    }
}

#[test]
fn word_count_of_an_empty_file_emits_nothing() {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    let env = common::env();
    let (sink, collected) = CollectSink::new();
    env.from_source(
        FileSource::text_lines(file.path()),
        WatermarkStrategy::no_watermarks(),
        "text",
    )
    .flat_map(|line: String, out: &mut Collector<'_, String>| {
        for word in words_of(&line) {
            out.collect(word);
        }
    })
    .map(|word: String| (word, 1u64))
    .key_by(|(word, _): &(String, u64)| word.clone())
    .reduce(|(word, a): (String, u64), (_, b): (String, u64)| (word, a + b))
    .sink_to(sink, "counts");
    let result = env.execute("word count").expect("the job succeeds");
    assert!(collected.is_empty());
    assert_eq!(result.records_out("Source: text"), 0);
}
