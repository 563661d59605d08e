//! A line-oriented file source: plain text lines, CSV rows or JSON lines, read through the
//! shard's io_uring (glommio's buffered file streams).
//!
//! Each file is one split (a directory stands for the files in it, sorted, hidden files
//! skipped); a split's position is the byte offset and line number of the next line, so a
//! restored split resumes at the first line not yet emitted. A malformed line fails the job
//! with the file, line number and content, unless [`FileSource::skip_malformed`] was asked for.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::LocalBoxFuture;
use futures_lite::io::BufReader;
use futures_lite::AsyncBufReadExt;
use glommio::io::{BufferedFile, StreamReader, StreamReaderBuilder};

use super::source::{
    Boundedness, ReadStatus, Source, SourceReader, SourceSplit, SplitEnumerator, StaticSplits,
};
use super::wake_filter::polled_when_woken;
use super::ConnectorError;
use crate::operator::RuntimeContext;

/// How a line becomes a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineFormat {
    /// The line itself, as a `String` (empty lines included).
    Text,
    /// A comma-separated row, as `Vec<String>` (double quotes group, `""` escapes a quote).
    Csv,
    /// One JSON value per line, deserialized with serde.
    JsonLines,
}

/// One file and the position reached in it.
#[derive(Clone, Debug, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct FileSplit {
    /// The file.
    #[rkyv(with = rkyv::with::AsString)]
    pub path: PathBuf,
    /// Byte offset of the next line.
    pub offset: u64,
    /// 1-based number of the next line.
    pub line: u64,
}

impl SourceSplit for FileSplit {
    fn split_id(&self) -> String {
        self.path.display().to_string()
    }
}

type Decoder<T> = Arc<dyn Fn(&str) -> Result<T, String> + Send + Sync>;

/// Reads records from the lines of files.
pub struct FileSource<T> {
    path: PathBuf,
    format: LineFormat,
    decode: Decoder<T>,
    skip_malformed: bool,
}

impl FileSource<String> {
    /// Every line of the file(s) at `path` as a `String`.
    pub fn text_lines(path: impl Into<PathBuf>) -> Self {
        FileSource::with_decoder(path, LineFormat::Text, |line| Ok(line.to_string()))
    }
}

impl FileSource<Vec<String>> {
    /// Every non-blank line of the CSV file(s) at `path` as its fields.
    pub fn csv(path: impl Into<PathBuf>) -> Self {
        FileSource::with_decoder(path, LineFormat::Csv, parse_csv_line)
    }
}

impl<T: serde::de::DeserializeOwned + 'static> FileSource<T> {
    /// Every non-blank line of the JSON-lines file(s) at `path`, deserialized as `T`.
    pub fn json_lines(path: impl Into<PathBuf>) -> Self {
        FileSource::with_decoder(path, LineFormat::JsonLines, |line| {
            serde_json::from_str(line).map_err(|e| format!("invalid JSON ({e})"))
        })
    }
}

impl<T> FileSource<T> {
    fn with_decoder(
        path: impl Into<PathBuf>,
        format: LineFormat,
        decode: impl Fn(&str) -> Result<T, String> + Send + Sync + 'static,
    ) -> Self {
        FileSource {
            path: path.into(),
            format,
            decode: Arc::new(decode),
            skip_malformed: false,
        }
    }

    /// Skips malformed lines instead of failing the job; each is logged with its file and line.
    pub fn skip_malformed(mut self) -> Self {
        self.skip_malformed = true;
        self
    }
}

/// Splits one CSV line into fields.
pub(crate) fn parse_csv_line(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    let mut at_field_start = true;
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            '"' if quoted => {
                quoted = false;
                if !matches!(chars.peek(), None | Some(',')) {
                    return Err("text after a closing quote".into());
                }
            }
            '"' if at_field_start => quoted = true,
            '"' => return Err("a quote inside an unquoted field".into()),
            ',' if !quoted => {
                fields.push(std::mem::take(&mut field));
                at_field_start = true;
                continue;
            }
            c => field.push(c),
        }
        at_field_start = false;
    }
    if quoted {
        return Err("an unterminated quoted field".into());
    }
    fields.push(field);
    Ok(fields)
}

fn files_under(path: &Path) -> Vec<PathBuf> {
    match std::fs::read_dir(path) {
        Ok(entries) => {
            let mut files: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .filter(|p| {
                    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                    !name.starts_with('.') && !name.starts_with('_')
                })
                .collect();
            files.sort();
            files
        }
        // A file, or a path that does not exist: the reader reports it when opening.
        Err(_) => vec![path.to_path_buf()],
    }
}

impl<T: Send + 'static> Source<T> for FileSource<T> {
    type Split = FileSplit;

    fn boundedness(&self) -> Boundedness {
        Boundedness::Bounded
    }

    fn create_enumerator(&self, _parallelism: usize) -> Box<dyn SplitEnumerator<FileSplit>> {
        let splits = files_under(&self.path)
            .into_iter()
            .map(|path| FileSplit {
                path,
                offset: 0,
                line: 1,
            })
            .collect();
        Box::new(StaticSplits::shared(splits))
    }

    fn create_reader(&self, _ctx: &RuntimeContext) -> Box<dyn SourceReader<T, FileSplit>> {
        Box::new(FileReader {
            format: self.format,
            decode: Arc::clone(&self.decode),
            skip_malformed: self.skip_malformed,
            pending: Vec::new(),
            added: 0,
            current: None,
            line: Vec::new(),
        })
    }
}

struct OpenFile {
    number: u32,
    split: FileSplit,
    reader: BufReader<StreamReader>,
}

struct FileReader<T> {
    format: LineFormat,
    decode: Decoder<T>,
    skip_malformed: bool,
    /// Splits not yet opened, with their numbers (in the order they were added), last first.
    pending: Vec<(u32, FileSplit)>,
    added: u32,
    current: Option<OpenFile>,
    line: Vec<u8>,
}

impl<T> FileReader<T> {
    async fn open(number: u32, split: FileSplit) -> Result<OpenFile, ConnectorError> {
        let file = BufferedFile::open(&split.path).await.map_err(|e| {
            ConnectorError::bad_input(format!(
                "file source cannot open '{}': {e}; check the path given to FileSource",
                split.path.display()
            ))
        })?;
        let stream = StreamReaderBuilder::new(file)
            .with_start_pos(split.offset)
            .with_buffer_size(128 << 10)
            .build();
        Ok(OpenFile {
            number,
            split,
            reader: BufReader::with_capacity(128 << 10, stream),
        })
    }

    async fn read(&mut self, out: &mut Vec<T>, max: usize) -> Result<ReadStatus, ConnectorError> {
        if self.current.is_none() {
            let Some((number, split)) = self.pending.pop() else {
                return Ok(ReadStatus::NeedSplit);
            };
            self.current = Some(Self::open(number, split).await?);
        }
        let file = self.current.as_mut().expect("opened above");
        let mut emitted = 0;
        while emitted < max {
            self.line.clear();
            let n = file
                .reader
                .read_until(b'\n', &mut self.line)
                .await
                .map_err(|e| {
                    ConnectorError::external(format!(
                        "file source cannot read '{}' at byte {}: {e}",
                        file.split.path.display(),
                        file.split.offset
                    ))
                })?;
            if n == 0 {
                let number = file.number;
                if emitted > 0 {
                    // Hand these records over first; the next poll finds the end again.
                    return Ok(ReadStatus::Records { split: number });
                }
                self.current = None;
                return Ok(ReadStatus::SplitFinished { split: number });
            }
            let (line_no, path) = (file.split.line, &file.split.path);
            file.split.offset += n as u64;
            file.split.line += 1;
            let mut bytes = &self.line[..];
            if let Some(stripped) = bytes.strip_suffix(b"\n") {
                bytes = stripped.strip_suffix(b"\r").unwrap_or(stripped);
            }
            let decoded = match std::str::from_utf8(bytes) {
                Ok(text) if self.format != LineFormat::Text && text.trim().is_empty() => continue,
                Ok(text) => (self.decode)(text),
                Err(e) => Err(format!("invalid UTF-8 ({e})")),
            };
            match decoded {
                Ok(record) => {
                    out.push(record);
                    emitted += 1;
                }
                Err(problem) => {
                    let shown =
                        String::from_utf8_lossy(&bytes[..bytes.len().min(120)]).into_owned();
                    let message = format!(
                        "{} line {line_no} is malformed: {problem}: {shown:?}; fix or remove the line, \
                         or build the source with FileSource::skip_malformed() to skip such lines",
                        path.display()
                    );
                    if !self.skip_malformed {
                        return Err(ConnectorError::bad_input(message));
                    }
                    tracing::warn!(file = %path.display(), line = line_no, "skipping malformed line: {problem}");
                }
            }
        }
        Ok(ReadStatus::Records { split: file.number })
    }
}

impl<T> SourceReader<T, FileSplit> for FileReader<T> {
    fn add_split(&mut self, split: FileSplit) {
        self.pending.insert(0, (self.added, split));
        self.added += 1;
    }

    fn poll_next<'a>(
        &'a mut self,
        out: &'a mut Vec<T>,
        max: usize,
    ) -> LocalBoxFuture<'a, Result<ReadStatus, ConnectorError>> {
        Box::pin(polled_when_woken(self.read(out, max)))
    }

    fn snapshot_splits(&self) -> Vec<FileSplit> {
        self.current
            .iter()
            .map(|f| f.split.clone())
            .chain(self.pending.iter().rev().map(|(_, s)| s.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::parse_csv_line;

    #[test]
    fn csv_fields() {
        assert_eq!(parse_csv_line("a,b,,c").unwrap(), ["a", "b", "", "c"]);
        assert_eq!(
            parse_csv_line("\"x, y\",\"say \"\"hi\"\"\"").unwrap(),
            ["x, y", "say \"hi\""]
        );
        assert!(parse_csv_line("\"open").is_err());
        assert!(parse_csv_line("a\"b").is_err());
        assert!(parse_csv_line("\"a\"b").is_err());
    }
}
