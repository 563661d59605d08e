//! The states registered with one keyed backend, by name, in registration order.
//!
//! A registration remembers the state's [`StateSignature`] (kind, types, TTL) and its
//! backend-specific table. Registering a name again returns the same table when the signatures
//! agree and an error naming the state when they do not.

use std::any::Any;
use std::cell::RefCell;
use std::rc::Rc;

use indexmap::IndexMap;

use crate::descriptor::StateSignature;
use crate::error::{StateError, StateErrorKind};

struct Registered {
    signature: StateSignature,
    table: Rc<dyn Any>,
}

/// Registered states of one backend.
#[derive(Default)]
pub(crate) struct Registry {
    states: RefCell<IndexMap<String, Registered>>,
}

impl Registry {
    /// The table registered as `name`, or a new one from `create` (which may fail), after
    /// checking that `signature` matches any earlier registration. `created` tells whether the
    /// table is new.
    pub(crate) fn get_or_register<T: Any>(
        &self,
        name: &str,
        signature: StateSignature,
        create: impl FnOnce() -> Result<Rc<T>, StateError>,
    ) -> Result<Rc<T>, StateError> {
        if let Some(existing) = self.states.borrow().get(name) {
            let mismatch = || -> StateError {
                StateErrorKind::IncompatibleRegistration {
                    state: name.to_string(),
                    registered: existing.signature.to_string(),
                    requested: signature.to_string(),
                }
                .into()
            };
            if existing.signature != signature {
                return Err(mismatch());
            }
            return Rc::clone(&existing.table)
                .downcast::<T>()
                .map_err(|_| mismatch());
        }
        let table = create()?;
        self.states.borrow_mut().insert(
            name.to_string(),
            Registered {
                signature,
                table: Rc::clone(&table) as Rc<dyn Any>,
            },
        );
        Ok(table)
    }

    /// Names of the registered states, in registration order.
    pub(crate) fn names(&self) -> Vec<String> {
        self.states.borrow().keys().cloned().collect()
    }

    /// The signature of a registered state.
    pub(crate) fn signature(&self, name: &str) -> Option<StateSignature> {
        self.states
            .borrow()
            .get(name)
            .map(|registered| registered.signature.clone())
    }
}
