//! Streaming word count over a text file: split lines into lowercase words, key by word and
//! keep a running count, emitting `(word, count)` on every occurrence — the first job every
//! Flink user writes.

use std::path::Path;

use weir_engine::prelude::*;

use crate::Output;

/// Splits a line into lowercase words (letters, digits and apostrophes).
pub fn words(line: &str) -> impl Iterator<Item = String> + '_ {
    line.split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .map(|w| w.trim_matches('\''))
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
}

/// The sample text shipped with the repository (used when `weir run word-count` gets no input).
pub const SAMPLE_INPUT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data/words.txt");

/// Adds the word count job reading `input` (a file or a directory of files) to `env`.
pub fn build(env: &StreamEnvironment, input: &Path, output: Output) {
    let counts = env
        .from_source(
            FileSource::text_lines(input),
            WatermarkStrategy::no_watermarks(),
            "lines",
        )
        .uid("lines")
        .flat_map(|line: String, out: &mut Collector<'_, (String, u64)>| {
            for word in words(&line) {
                out.collect((word, 1));
            }
        })
        .name("Tokenize")
        .key_by(|(word, _): &(String, u64)| word.clone())
        .reduce(|(word, a), (_, b)| (word, a + b))
        .name("Count")
        .uid("count");
    match output {
        Output::Print => counts.sink_to(PrintSink::new(), "print"),
        Output::Files(dir) => counts.sink_to(
            FileSink::with_formatter(dir, |(word, count): &(String, u64), line: &mut String| {
                line.push_str(word);
                line.push(',');
                line.push_str(&count.to_string());
            }),
            "files",
        ),
        Output::Discard => counts.sink_to(DiscardSink::new(), "discard"),
    };
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    #[test]
    fn word_count_matches_a_direct_count() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.txt");
        let text = include_str!("../data/words.txt");
        std::fs::write(&input, text).unwrap();
        let out = dir.path().join("out");
        let env = StreamEnvironment::new(Configuration::default()).unwrap();
        build(&env, &input, Output::Files(out.clone()));
        env.execute("word count").unwrap();

        let mut expected: HashMap<String, u64> = HashMap::new();
        for word in text.lines().flat_map(words) {
            *expected.entry(word).or_default() += 1;
        }
        let mut got: HashMap<String, u64> = HashMap::new();
        let mut updates = 0;
        for entry in std::fs::read_dir(&out).unwrap() {
            for line in std::fs::read_to_string(entry.unwrap().path())
                .unwrap()
                .lines()
            {
                let (word, count) = line.rsplit_once(',').unwrap();
                let count: u64 = count.parse().unwrap();
                let best = got.entry(word.to_string()).or_default();
                *best = (*best).max(count);
                updates += 1;
            }
        }
        assert_eq!(got, expected);
        assert_eq!(updates, expected.values().sum::<u64>());
    }

    #[test]
    fn words_are_lowercased_and_split_on_punctuation() {
        let w: Vec<String> = words("It's a Stream, a 'stream'--of 2 records!").collect();
        assert_eq!(
            w,
            ["it's", "a", "stream", "a", "stream", "of", "2", "records"]
        );
    }
}
