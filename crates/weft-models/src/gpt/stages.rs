//! The gpt cut into pipeline stages: runs of consecutive blocks, the first stage also holding
//! the embeddings, the last the final LayerNorm and the output layer (tied to the token
//! embedding, so the first and last stage both hold it).

use std::ops::Range;

use weft_core::{Result, Tensor};
use weft_nn::{Context, Module};

use super::Gpt;
use crate::config_check::block_index;
use crate::stage_cut::StageWeights;
use crate::StagedModel;

impl Gpt {
    /// The blocks of each of `stages` pipeline stages, by [`Gpt::stage_cut`] (the embeddings
    /// count on the first stage; the final LayerNorm and the tied output layer on the last).
    pub fn stage_blocks(&self, stages: usize) -> Result<Vec<Range<usize>>> {
        self.stage_cut.ranges(
            stages,
            || StageWeights {
                blocks: self.h.iter().map(|b| b.num_parameters()).collect(),
                first: self.wte.num_parameters() + self.wpe.num_parameters(),
                last: self.ln_f.num_parameters() + self.wte.num_parameters(),
            },
            self.h.len(),
        )
    }
}

impl StagedModel for Gpt {
    fn stage_forward(&self, stage: usize, stages: usize, input: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let blocks = self.stage_blocks(stages)?[stage].clone();
        let x = if stage == 0 { self.embed(input)? } else { input.clone() };
        let x = self.run_blocks(x, blocks)?;
        if stage + 1 < stages {
            return Ok(x);
        }
        self.loss_of_logits(&self.logits(&x)?, targets)
    }

    fn stage_parameters(&self, stage: usize, stages: usize) -> Result<Vec<(String, Tensor)>> {
        let blocks = self.stage_blocks(stages)?[stage].clone();
        let mine = |name: &str| match block_index(name, "transformer.h.") {
            Some(i) => blocks.contains(&i),
            None if name.starts_with("transformer.wte.") => stage == 0 || stage + 1 == stages,
            None if name.starts_with("transformer.wpe.") => stage == 0,
            None => stage + 1 == stages,
        };
        Ok(self.parameters().into_iter().filter(|(n, _)| mine(n)).collect())
    }

    fn activation_shape(&self, input_shape: &[usize]) -> Vec<usize> {
        let held = crate::lm::held_positions(input_shape[1], self.sequence.as_ref());
        vec![input_shape[0], held, self.config.n_embd]
    }

    fn shared_parameters(&self) -> Vec<String> {
        vec!["transformer.wte.weight".to_string()]
    }

    fn stage_context(&self) -> &Context {
        &self.ctx
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpt::GptConfig;
    use crate::StageCut;

    fn gpt(n_layer: usize, vocab_size: usize) -> Gpt {
        let config = GptConfig {
            vocab_size,
            block_size: 8,
            n_layer,
            n_head: 2,
            n_embd: 16,
            bias: true,
            dropout: 0.0,
            activation: weft_core::UnaryOp::Gelu,
        };
        Gpt::new(config, 1).unwrap()
    }

    #[test]
    fn blocks_are_shared_out_evenly_or_as_given() {
        let mut g = gpt(5, 16);
        assert_eq!(g.stage_blocks(2).unwrap(), [0..3, 3..5]);
        assert_eq!(g.stage_blocks(5).unwrap(), [0..1, 1..2, 2..3, 3..4, 4..5]);
        assert!(g.stage_blocks(6).unwrap_err().to_string().contains("parallel.pp = 6"));
        g.stage_cut = StageCut::Given(vec![1, 4]);
        assert_eq!(g.stage_blocks(2).unwrap(), [0..1, 1..5]);
        for bad in [vec![2, 2], vec![5, 0], vec![1, 1, 3]] {
            g.stage_cut = StageCut::Given(bad.clone());
            let e = g.stage_blocks(2).unwrap_err().to_string();
            assert!(e.contains("parallel.stage_blocks"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_parameter_balanced_cut_gives_the_embedding_stages_fewer_blocks() {
        // a vocabulary of 2000 x 16 outweighs a block (about 3,300 parameters) many times
        let mut g = gpt(8, 2000);
        g.stage_cut = StageCut::Parameters;
        let cut = g.stage_blocks(3).unwrap();
        let lens: Vec<usize> = cut.iter().map(|r| r.len()).collect();
        assert_eq!(lens.iter().sum::<usize>(), 8);
        assert!(lens[1] > lens[0] && lens[1] > lens[2], "{lens:?}");
        // and its largest stage is no larger than the even cut's
        let largest = |g: &Gpt| -> usize {
            (0..3)
                .map(|s| {
                    g.stage_parameters(s, 3)
                        .unwrap()
                        .iter()
                        .map(|(_, t)| t.numel())
                        .sum::<usize>()
                })
                .max()
                .unwrap()
        };
        let balanced = largest(&g);
        g.stage_cut = StageCut::Blocks;
        assert!(balanced < largest(&g));
    }
}
