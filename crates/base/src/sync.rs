//! Lock helpers.

use std::sync::Mutex;

/// Locks a mutex, recovering the data if a panicking holder poisoned it: the guarded maps
/// stay consistent because every critical section is a single insert/remove/read.
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
