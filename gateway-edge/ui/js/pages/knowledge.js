// The knowledge page (placeholder until it is built).
import { h } from '../dom.js';

export function mount(root) {
  root.appendChild(h('h1', null, 'knowledge'));
  return () => {};
}
