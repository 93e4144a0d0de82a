import type { ComponentChildren } from 'preact';
import { useState } from 'preact/hooks';
import { described, Field } from './ui';

/** What a form can be read back from: the form and cluster an object shows as, or why it cannot. */
export interface FromInput<F> {
  form?: F;
  cluster?: string;
  why?: string;
}

/**
 * A "new object" page's second mode: the object as JSON, switched to from the form and back.
 * `kind` names the object in messages ("drive"), `example` the recipe file it looks like.
 */
export function useJsonEditing<F, I extends { spec?: unknown }>(options: {
  kind: string;
  example: string;
  toInput: () => I;
  fromInput: (parsed: unknown) => FromInput<F>;
  setForm: (form: F) => void;
  cluster: string;
  setCluster: (cluster: string) => void;
}) {
  const [asJson, setAsJson] = useState(false);
  const [json, setJson] = useState('');
  const [problem, setProblem] = useState<string>();

  const toJson = () => {
    setJson(JSON.stringify(options.toInput(), null, 2));
    setProblem(undefined);
    setAsJson(true);
  };
  const toForm = () => {
    let parsed: unknown;
    try {
      parsed = JSON.parse(json);
    } catch (e) {
      setProblem(`This is not JSON (${(e as Error).message}): fix it to go back to the form.`);
      return;
    }
    const { form, cluster, why } = options.fromInput(parsed);
    if (!form) {
      setProblem(`The form cannot show this ${options.kind}: ${why}. Keep editing it as JSON.`);
      return;
    }
    options.setForm(form);
    if (cluster) options.setCluster(cluster);
    setProblem(undefined);
    setAsJson(false);
  };
  /** The JSON as the body to send, with the chosen cluster when it names none; undefined (and the problem shown) when it is not an object. */
  const input = (): I | undefined => {
    let input: I;
    try {
      input = JSON.parse(json);
    } catch (err) {
      setProblem(`This is not JSON: ${(err as Error).message}`);
      return undefined;
    }
    if (!input || typeof input !== 'object' || Array.isArray(input)) {
      setProblem(`Give a JSON object with metadata and spec, like ${options.example}.`);
      return undefined;
    }
    setProblem(undefined);
    // The recipe's files name no cluster: the one chosen above applies.
    const spec = input.spec as { cluster?: string } | undefined;
    if (spec && typeof spec === 'object' && spec.cluster === undefined && options.cluster) {
      input = { ...input, spec: { ...spec, cluster: options.cluster } };
    }
    return input;
  };
  return { asJson, json, setJson, problem, toJson, toForm, input };
}

/** The textarea of the JSON mode, with its problem under it. */
export function JsonField(props: {
  id: string;
  label: string;
  hint: ComponentChildren;
  problem?: string;
  value: string;
  onInput: (value: string) => void;
}) {
  const messages = props.problem ? [props.problem] : [];
  return (
    <Field id={props.id} label={props.label} hint={props.hint} messages={messages}>
      <textarea
        {...described(props.id, undefined, [], true, messages)}
        class="code"
        rows={24}
        spellcheck={false}
        value={props.value}
        onInput={(e) => props.onInput(e.currentTarget.value)}
      />
    </Field>
  );
}
