//! A development root CA for tests and the demo (root-cert.pem and root-key.pem in a directory).

use std::path::Path;

/// Write a development root CA for `trust_domain` into `dir`, valid for a day.
pub fn write_dev_ca(dir: &Path, trust_domain: &str) -> Result<(), weft_identity::Error> {
    weft_identity::ca::write_root(dir, trust_domain, std::time::Duration::from_secs(24 * 3600))
}
