//! Host checks and tuners (CPU governor, IRQ affinity, memlock, UDP buffers) and systemd unit
//! rendering. Empty until the deployment work lands; `weir-memory` computes memory budgets today.
#![warn(missing_docs)]
