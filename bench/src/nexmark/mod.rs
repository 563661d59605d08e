//! Nexmark, the auction benchmark every stream engine publishes numbers for (see
//! `NEXMARK.md`): its event model, the standard generator, and hand-written single-threaded
//! baselines of the queries.
//!
//! - [`model`]: [`Person`], [`Auction`], [`Bid`], [`Event`] and every query's output record,
//!   with the exact semantics of each query.
//! - [`generator`]: [`NexmarkGenerator`], Beam's generator, deterministic per
//!   `(config, seed, index)`; it is a `weir_engine::connector::Generator<Event>`, so
//!   `DataGeneratorSource::new(Some(events), generator)` is the Nexmark source.
//! - [`baseline`]: each query as a plain loop (`qN` over any events, `run_qN` over the
//!   generator's), Weir's COST reference.
//! - [`queries`]: each query as a Weir job over the DataStream API (`qN(events) -> DataStream`
//!   of its output), on [`queries::source`], the generator as a timestamped, watermarked source;
//!   a run of any parallelism matches the baseline's checksum.
//! - [`checksum`]: the order-independent [`Checksum`] of a query's output, which an engine run
//!   of any parallelism must match ([`StableHash`] is implemented by every output type).

pub mod baseline;
pub mod checksum;
pub mod generator;
pub mod harness;
pub mod model;
pub mod queries;

pub use checksum::{
    checksum_of, q12_totals, q4_final, BaselineResult, Checksum, FieldHasher, StableHash,
};
pub use generator::{
    NexmarkConfig, NexmarkConfigError, NexmarkGenerator, FIRST_AUCTION_ID, FIRST_PERSON_ID,
};
pub use model::{
    Auction, AuctionPrice, Bid, BidderSession, BidderTotal, BidderWindowCount, CategoryAverage,
    CurrencyConversion, Event, HighestBid, HotItem, LocalItemSuggestion, NewUser, Person,
};
