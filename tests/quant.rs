//! The CPU quantiser and dequantiser are the definition the kernels are tested against, so they
//! must be MLX's own: quantising the fixtures' bf16 weights must reproduce, bit for bit, every
//! packed word, scale and bias that `mlx_lm.convert` wrote into the 4-bit fixtures (including
//! the 8-bit router of tiny-moe).

mod common;

use kestrel::loader::{SafetensorsFile, TensorStore};
use kestrel::quant::{self, floats_to_f32, DType, QuantLayout};

fn store(path: std::path::PathBuf) -> TensorStore {
    TensorStore::from_files(vec![SafetensorsFile::open(&path).unwrap()])
}

#[test]
fn quantize_reproduces_mlx_convert_bit_for_bit() {
    for name in ["tiny-e2b", "tiny-e4b", "tiny-moe"] {
        let hf = store(common::fixtures().join(name).join("hf/model.safetensors"));
        let mlx = store(common::fixtures().join(name).join("mlx-4bit/model.safetensors"));
        let mut checked = 0;
        for qname in mlx.names().filter(|n| n.ends_with(".scales")).cloned().collect::<Vec<_>>() {
            let module = qname.trim_end_matches(".scales");
            // MLX splits HF's fused expert gate_up_proj; compare the unsplit tensors only.
            if module.contains("switch_glu") {
                continue;
            }
            let hf_name = format!("{}.weight", module.replacen("language_model.model.", "model.language_model.", 1));
            let src = hf.get(&hf_name).unwrap_or_else(|| panic!("{name}: no {hf_name} in hf"));
            let w = floats_to_f32(src.bytes(), src.dtype());
            let (rows, cols) = (src.shape()[0], src.shape()[1]);
            let words = mlx.get(&format!("{module}.weight")).unwrap();
            let bits = (words.shape()[1] * 32 / cols) as u32;
            let q = quant::quantize(&w, rows, cols, bits, 64);
            assert_eq!(
                bytemuck::cast_slice::<u32, u8>(&q.words),
                words.bytes(),
                "{name} {module}: packed words differ"
            );
            let scales = mlx.get(&format!("{module}.scales")).unwrap();
            let biases = mlx.get(&format!("{module}.biases")).unwrap();
            assert_eq!(scales.dtype(), DType::BF16);
            assert_eq!(bytemuck::cast_slice::<_, u8>(&q.scales), scales.bytes(), "{name} {module}: scales differ");
            assert_eq!(bytemuck::cast_slice::<_, u8>(&q.biases), biases.bytes(), "{name} {module}: biases differ");

            // And the dequantiser inverts the packing: every weight within one step of the
            // original (MLX moves the scale so that zero is exact, which can stretch the
            // error at the far end of a group up to one step) — checked on the first row.
            let l = QuantLayout { rows, cols, bits, group_size: 64 };
            let mut row = vec![0.0; cols];
            quant::dequant_row(&l, words.bytes(), scales.bytes(), biases.bytes(), 0, &mut row);
            for g in 0..cols / 64 {
                let s = q.scales[g].to_f32().abs();
                for c in g * 64..(g + 1) * 64 {
                    assert!((row[c] - w[c]).abs() <= 1.01 * s + 1e-6, "{name} {module}[0,{c}]: {} vs {}", row[c], w[c]);
                }
            }
            checked += 1;
        }
        assert!(checked > 10, "{name}: only {checked} quantised tensors compared");
        eprintln!("{name}: {checked} quantised tensors reproduced bit for bit");
    }
}
