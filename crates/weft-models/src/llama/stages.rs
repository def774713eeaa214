//! The llama cut into pipeline stages: runs of consecutive decoder layers, the first stage also
//! holding the token embedding, the last the final norm and the output head (with tied
//! embeddings, the token embedding: the first and last stage both hold it).

use std::ops::Range;

use weft_core::{Result, Tensor};
use weft_nn::{Context, Module};

use super::Llama;
use crate::config_check::block_index;
use crate::stage_cut::StageWeights;
use crate::StagedModel;

impl Llama {
    /// The layers of each of `stages` pipeline stages, by [`Llama::stage_cut`].
    pub fn stage_layers(&self, stages: usize) -> Result<Vec<Range<usize>>> {
        let head = match &self.lm_head {
            Some(h) => h.num_parameters(),
            None => self.embed_tokens.num_parameters(),
        };
        self.stage_cut.ranges(
            stages,
            || StageWeights {
                blocks: self.layers.iter().map(|l| l.num_parameters()).collect(),
                first: self.embed_tokens.num_parameters(),
                last: self.norm.num_parameters() + head,
            },
            self.layers.len(),
        )
    }
}

impl StagedModel for Llama {
    fn stage_forward(&self, stage: usize, stages: usize, input: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let layers = self.stage_layers(stages)?[stage].clone();
        let x = if stage == 0 { self.embed(input)? } else { input.clone() };
        let x = self.run_layers(x, layers)?;
        if stage + 1 < stages {
            return Ok(x);
        }
        self.loss_of_logits(&self.logits(&x)?, targets)
    }

    fn stage_parameters(&self, stage: usize, stages: usize) -> Result<Vec<(String, Tensor)>> {
        let layers = self.stage_layers(stages)?[stage].clone();
        let (first, last) = (stage == 0, stage + 1 == stages);
        let tied = self.lm_head.is_none();
        let mine = |name: &str| match block_index(name, "model.layers.") {
            Some(i) => layers.contains(&i),
            None if name.starts_with("model.embed_tokens.") => first || (tied && last),
            None => last,
        };
        Ok(self.parameters().into_iter().filter(|(n, _)| mine(n)).collect())
    }

    fn activation_shape(&self, input_shape: &[usize]) -> Vec<usize> {
        let held = crate::lm::held_positions(input_shape[1], self.sequence.as_ref());
        vec![input_shape[0], held, self.config.n_embd]
    }

    fn shared_parameters(&self) -> Vec<String> {
        if self.lm_head.is_none() {
            vec!["model.embed_tokens.weight".to_string()]
        } else {
            Vec::new()
        }
    }

    fn stage_context(&self) -> &Context {
        &self.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::LlamaConfig;

    fn llama(n_layer: usize, tie: bool) -> Llama {
        let config = LlamaConfig {
            vocab_size: 40,
            block_size: 8,
            n_layer,
            n_head: 4,
            n_kv_head: 2,
            n_embd: 16,
            intermediate_size: 24,
            rope_theta: 10000.0,
            rope_scaling: None,
            norm_eps: 1e-5,
            tie_embeddings: tie,
            qkv_bias: false,
            head_dim: None,
            qk_norm: false,
            padding_idx: None,
        };
        Llama::new(config, 1).unwrap()
    }

    #[test]
    fn every_parameter_is_on_a_stage_and_only_the_tied_embedding_on_two() {
        for tie in [false, true] {
            // the default cut: by blocks
            let m = llama(5, tie);
            assert_eq!(m.stage_layers(2).unwrap(), [0..3, 3..5]);
            let mut seen = std::collections::BTreeMap::<String, usize>::new();
            for s in 0..3 {
                for (n, _) in m.stage_parameters(s, 3).unwrap() {
                    *seen.entry(n).or_default() += 1;
                }
            }
            let all: Vec<String> = m.parameters().into_iter().map(|(n, _)| n).collect();
            assert_eq!(seen.len(), all.len(), "tie {tie}");
            let twice: Vec<&String> = seen.iter().filter(|(_, &c)| c > 1).map(|(n, _)| n).collect();
            assert_eq!(twice, m.shared_parameters().iter().collect::<Vec<_>>(), "tie {tie}");
            let last: Vec<String> = m.stage_parameters(2, 3).unwrap().into_iter().map(|(n, _)| n).collect();
            assert!(last.contains(&"model.norm.weight".to_string()));
            assert_eq!(last.contains(&"lm_head.weight".to_string()), !tie);
        }
    }
}
