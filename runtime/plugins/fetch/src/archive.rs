//! `plugin.wasm` out of an image layer (a tar, gzipped or not), bounded: the decompressed stream may not exceed
//! the module limit (a gzip bomb stops there).

use std::io::Read;

const PLUGIN_FILE: &str = "plugin.wasm";

/// The bytes of the first regular file named `plugin.wasm` (at any depth) in the layer.
pub(crate) fn plugin_wasm(layer: &[u8], gzip: bool, limit: u64) -> Result<Vec<u8>, String> {
    let reader: Box<dyn Read + '_> = if gzip {
        Box::new(flate2::read::GzDecoder::new(layer))
    } else {
        Box::new(layer)
    };
    // The tar stream itself (headers and every entry) is bounded, not just the file we want.
    let bounded = reader.take(limit.saturating_add(64 << 10));
    let mut archive = tar::Archive::new(bounded);
    let entries = archive.entries().map_err(|e| {
        format!(
            "the layer is not a tar{}: {e}",
            if gzip { ".gz" } else { "" }
        )
    })?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("bad tar entry in the layer: {e}"))?;
        let is_plugin = entry
            .path()
            .ok()
            .and_then(|p| p.file_name().map(|n| n == PLUGIN_FILE))
            .unwrap_or(false);
        if !is_plugin || !entry.header().entry_type().is_file() {
            continue;
        }
        let size = entry
            .header()
            .size()
            .map_err(|e| format!("bad tar header: {e}"))?;
        if size > limit {
            return Err(format!(
                "{PLUGIN_FILE} is {size} bytes, over the limit of {limit}"
            ));
        }
        let mut out = Vec::with_capacity(size as usize);
        entry
            .read_to_end(&mut out)
            .map_err(|e| format!("cannot read {PLUGIN_FILE} from the layer: {e}"))?;
        return Ok(out);
    }
    Err(format!("no {PLUGIN_FILE} in the layer"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    pub(crate) fn layer(files: &[(&str, &[u8])], gzip: bool) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).expect("append");
        }
        let tar = b.into_inner().expect("tar");
        if !gzip {
            return tar;
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).expect("gzip");
        gz.finish().expect("gzip")
    }

    #[test]
    fn finds_plugin_wasm_and_says_what_is_wrong() {
        let l = layer(&[("README", b"x"), ("dir/plugin.wasm", b"\0asm")], true);
        assert_eq!(plugin_wasm(&l, true, 1 << 20).as_deref(), Ok(&b"\0asm"[..]));
        let l = layer(&[("plugin.wasm", b"\0asm")], false);
        assert_eq!(
            plugin_wasm(&l, false, 1 << 20).as_deref(),
            Ok(&b"\0asm"[..])
        );
        let l = layer(&[("other.wasm", b"\0asm")], true);
        assert!(plugin_wasm(&l, true, 1 << 20).is_err_and(|e| e.contains("no plugin.wasm")));
        let l = layer(&[("plugin.wasm", &[0u8; 4096])], true);
        assert!(plugin_wasm(&l, true, 1000).is_err_and(|e| e.contains("over the limit")));
        assert!(plugin_wasm(b"not gzip", true, 1000).is_err());
    }
}
