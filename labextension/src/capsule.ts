/**
 * `.capsule.md` files (SPEC §8) open as Markdown, with the soba capsule icon: a file type
 * of their own (so the file browser shows the icon), opened by the Markdown preview by
 * default — editing a capsule breaks its checksum, so reading is the common case — or by
 * the Markdown editor through "Open With".
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';

import { capsuleIcon } from './icon';

export const CAPSULE_FILE_TYPE = 'soba-capsule';
export const CAPSULE_EXTENSION = '.capsule.md';
/** JupyterLab's Markdown preview and text editor factories, the default first. */
export const CAPSULE_FACTORIES = ['Markdown Preview', 'Editor'];

export const isCapsuleFile = (path: string): boolean =>
  path.toLowerCase().endsWith(CAPSULE_EXTENSION);

export const capsuleFiles: JupyterFrontEndPlugin<void> = {
  id: 'soba-nb-labextension:capsule-files',
  description: 'Open .capsule.md files as Markdown, with the soba capsule icon.',
  autoStart: true,
  activate: (app: JupyterFrontEnd): void => {
    const registry = app.docRegistry;
    registry.addFileType(
      {
        name: CAPSULE_FILE_TYPE,
        displayName: 'soba capsule',
        extensions: [CAPSULE_EXTENSION],
        mimeTypes: ['text/markdown'],
        contentType: 'file',
        fileFormat: 'text',
        icon: capsuleIcon
      },
      CAPSULE_FACTORIES
    );
    // Both factories give their tab the Markdown icon; a capsule's tab gets its own.
    for (const factory of CAPSULE_FACTORIES) {
      registry.addWidgetExtension(factory, {
        createNew: (widget, context) => {
          const mark = (): void => {
            if (isCapsuleFile(context.path)) {
              widget.title.icon = capsuleIcon;
            }
          };
          mark();
          context.pathChanged.connect(mark);
        }
      });
    }
  }
};
